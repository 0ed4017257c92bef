"""The alerting rules load in promtool, pass their unit tests (rules_test.yml), and load
as installed with the `rule_files` glob docs/METRICS.md gives."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from rdmad import exits
from rdmad.api import documents as docs
from tests.api.test_converged_truth import CASES, ctl_status, rdmad_converged
from tests.deploy.conftest import DEPLOY, require_tool
from tests.packaging.conftest import REPO
from tests.packaging.test_fleet_files import wanted as fleet_files

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


def test_not_converged_alert_agrees_with_the_cli_for_every_state(tmp_path: Path) -> None:
    """RdmadNotConverged fires for exactly the nodes `rdmad-ctl status` calls not
    converged (tests/api/test_converged_truth.py: one case per object state, failing
    passes, starting, an invalid config): the series are what rdmad's own /metrics
    says for each, the expectation what the CLI's exit code says."""
    promtool = require_tool("promtool", HINT)
    series, firing = [], []
    for case in CASES:
        gauge = rdmad_converged(case.snap)
        assert gauge is not None, case.name
        series.append(
            {"series": f'rdmad_converged{{instance="{case.name}"}}', "values": f"{gauge:g}x30"}
        )
        code, _ = ctl_status(docs.status_doc(case.snap, docs.DaemonFacts(1, 0.0)))
        if code != exits.OK:
            firing.append(
                {
                    "exp_labels": {"severity": "warning", "instance": case.name},
                    "exp_annotations": {
                        "summary": f"{case.name}: not converged for 15m (rdmad-ctl status says why)"
                    },
                }
            )
    assert firing and len(firing) < len(CASES)  # both kinds are in the test
    tests = {
        "rule_files": [str(RULES_DIR / "rdmad-alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "RdmadNotConverged", "exp_alerts": firing}
                ],
            }
        ],
    }
    path = tmp_path / "truth_test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_installed_rules_load_as_metrics_md_says(tmp_path: Path) -> None:
    """The directory as the packages install it (tests/packaging/test_fleet_files.py),
    loaded with the `rule_files` glob docs/METRICS.md gives: every file in it is a rule
    file (with the promtool tests beside them, the glob would fail)."""
    promtool = require_tool("promtool", HINT)
    share = "/usr/share/rdmad/"
    for source, installed in fleet_files().items():
        assert installed.startswith(share), installed
        dest = tmp_path / installed.removeprefix(share)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((REPO / source).read_bytes())
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "METRICS.md").read_text(), re.S)
    config = [b for b in blocks if "rule_files:" in b]
    assert len(config) == 1, "docs/METRICS.md shows one prometheus.yml snippet"
    path = tmp_path / "prometheus.yml"
    path.write_text(config[0].replace(share, f"{tmp_path}/"))
    result = subprocess.run(
        [promtool, "check", "config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rules = len(yaml.safe_load((RULES_DIR / "rdmad-alerts.yml").read_text())["groups"][0]["rules"])
    assert f"SUCCESS: {rules} rules found" in result.stdout, result.stdout
