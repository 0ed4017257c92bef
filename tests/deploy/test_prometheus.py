"""The alerting rules load in promtool and pass their unit tests (rules_test.yml)."""

from __future__ import annotations

import subprocess

from tests.deploy.conftest import DEPLOY, require_tool

RULES_DIR = DEPLOY / "prometheus"
HINT = "apt-get install prometheus (scripts/fleet-deps.sh does it as root)"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", HINT)
    return subprocess.run(
        [promtool, *args],
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rules_are_valid() -> None:
    result = _promtool("check", "rules", "rdmad-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_unit_tests_pass() -> None:
    result = _promtool("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
