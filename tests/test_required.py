"""A run that must run every test fails on a skip instead of passing it
(tests/support/required.py, tests/conftest.py; the lab's own variable in
tests/lab/conftest.py); `.ci/run` makes its run one, whatever CI exports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.required import why_required

REPO = Path(__file__).resolve().parents[1]
ENV = ("CI", "RDMAD_TESTS_REQUIRED", "RDMAD_LAB_REQUIRED")

SKIPS = """
import pytest


@pytest.fixture
def needs_a_tool():
    pytest.skip("no such tool here")


@pytest.mark.skipif(True, reason="needs root")
def test_skipif():
    pass


def test_skip_inside():
    pytest.skip("the kernel has no such module")


def test_skip_in_a_fixture(needs_a_tool):
    pass


@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False


def test_runs():
    pass
"""
MODULE_SKIP = 'import pytest\n\npytest.skip("nothing here", allow_module_level=True)\n'
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    lab: lab test\n"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A suite with every kind of skip, under the hooks of tests/conftest.py."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makeini(INI)
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_skips=SKIPS)
    return pytester


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({}, None),
        ({"CI": "true"}, "CI=true"),
        ({"CI": "1"}, "CI=1"),
        ({"CI": "yes"}, "CI=yes"),
        ({"CI": "false"}, None),
        ({"CI": "0"}, None),
        ({"CI": "no"}, None),
        ({"CI": "off"}, None),
        ({"CI": ""}, None),
        ({"RDMAD_TESTS_REQUIRED": "1"}, "RDMAD_TESTS_REQUIRED=1"),
        ({"RDMAD_TESTS_REQUIRED": "1", "CI": "false"}, "RDMAD_TESTS_REQUIRED=1"),
        ({"RDMAD_TESTS_REQUIRED": "0", "CI": "true"}, "CI=true"),
    ],
)
def test_which_runs_are_required(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], why: str | None
) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert why_required() == why
    monkeypatch.setenv("RDMAD_LAB_REQUIRED", "1")
    assert why_required("RDMAD_LAB_REQUIRED") == "RDMAD_LAB_REQUIRED=1"


@pytest.mark.parametrize(("name", "value"), [("CI", "1"), ("RDMAD_TESTS_REQUIRED", "1")])
def test_a_required_run_fails_every_skip(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    result = suite.runpytest("-p", "no:cacheprovider")
    # The skips in setup (skipif, a fixture's) fail as errors, the one in the test as a failure.
    assert result.parseoutcomes() == {"failed": 1, "errors": 2, "passed": 1, "xfailed": 1}
    for reason in ("needs root", "no such module", "no such tool here"):
        result.stdout.fnmatch_lines([f"*{name}={value}: a test may not skip here, *{reason}*"])
    # A module skipped as a whole is a collection error: the run stops there.
    suite.makepyfile(test_module_skip=MODULE_SKIP)
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"errors": 1}
    result.stdout.fnmatch_lines([f"*{name}={value}: a test module may not skip here, *nothing*"])


XFAILS = """
import pytest


@pytest.mark.xfail(reason="maybe broken")
def test_loose_and_failing():
    assert False


@pytest.mark.xfail(reason="maybe broken")
def test_loose_and_passing():
    pass


@pytest.mark.xfail(reason="a known bug", strict=True)
def test_strict_and_failing():
    assert False
"""


def test_a_required_run_fails_a_loose_xfail_and_an_xpass(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makepyfile(test_skips="", test_xfails=XFAILS)
    monkeypatch.setenv("RDMAD_TESTS_REQUIRED", "1")
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"failed": 2, "xfailed": 1}
    result.stdout.fnmatch_lines(
        [
            "*RDMAD_TESTS_REQUIRED=1: a non-strict xfail hides a pass as well as a failure*",
            "*RDMAD_TESTS_REQUIRED=1: an expected failure passed (XPASS)*",
        ],
        consecutive=False,
    )
    monkeypatch.delenv("RDMAD_TESTS_REQUIRED")
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"xfailed": 2, "xpassed": 1}


def test_elsewhere_a_skip_is_a_skip(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "false")
    suite.makepyfile(test_module_skip=MODULE_SKIP)
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"skipped": 4, "passed": 1, "xfailed": 1}


@pytest.mark.parametrize(("name", "value"), [("RDMAD_LAB_REQUIRED", "1"), ("CI", "1")])
def test_the_lab_conftest_fails_a_lab_skip_by_itself(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Only the lab's conftest here (no tests/conftest.py): it holds for a run of the lab
    alone, and RDMAD_LAB_REQUIRED leaves the tests outside the lab alone."""
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(REPO / "tests" / "lab")  # the lab's conftest imports harness
    monkeypatch.setenv(name, value)
    pytester.makeini(INI)
    lab = pytester.mkdir("lab")
    (lab / "conftest.py").write_text((REPO / "tests" / "lab" / "conftest.py").read_text())
    (lab / "test_in_lab.py").write_text(SKIPS)
    pytester.makepyfile(test_elsewhere=SKIPS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes == {"failed": 1, "errors": 2, "skipped": 3, "passed": 2, "xfailed": 2}
    result.stdout.fnmatch_lines(["*ERROR at setup of test_skipif*", f"{name}={value}: a lab*"])


def test_ci_run_requires_every_test(tmp_path: Path) -> None:
    # .ci/run ends in `exec bash scripts/test.sh`: a `bash` first on PATH shows the
    # environment that script would get, without running it.
    fake = tmp_path / "bash"
    fake.write_text('#!/bin/sh\necho "args=$*"\necho "required=$RDMAD_TESTS_REQUIRED"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    out = subprocess.run(
        ["/bin/bash", str(REPO / ".ci" / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.splitlines() == ["args=scripts/test.sh", "required=1"]
