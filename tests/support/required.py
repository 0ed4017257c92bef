"""Runs that must run every test: there, a skip is a failure, never a quiet pass.

`.ci/run` exports ``RDMAD_TESTS_REQUIRED=1``, so CI needs nothing from its
environment; a CI system's own ``CI`` (``true``, ``1``, ``yes``: any value but an
empty, ``0``, ``false``, ``no`` or ``off`` one) counts too. Areas may add their own
variable for runs of their tests alone (the lab: ``RDMAD_LAB_REQUIRED``).

tests/conftest.py applies the rule to every test and test module (a ``skipif`` that
holds, ``pytest.skip`` in a test or fixture, a module skipped as a whole). An expected
failure stays one only when it is strict (``xfail(strict=True)``: a known bug pinned,
whose fix fails the run until the mark goes); a non-strict xfail, which would hide a
pass and a failure alike, and an unexpected pass (XPASS) fail the run.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pluggy
import pytest

REQUIRED_ENV = "RDMAD_TESTS_REQUIRED"
_FALSE = frozenset({"", "0", "false", "no", "off"})


def why_required(*also: str) -> str | None:
    """The variable (``NAME=value``) that makes this run one where no test may skip, or
    None. ``also`` names an area's own variables, checked first."""
    for name in (*also, REQUIRED_ENV, "CI"):
        value = os.environ.get(name, "").strip()
        if value.lower() not in _FALSE:
            return f"{name}={value}"
    return None


def fail_skipped(report: pytest.TestReport | pytest.CollectReport, why: str, what: str) -> None:
    """Turn a skipped ``report`` into a failure that names ``why`` and the skip's reason."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"{why}: {what} may not skip here, but it did: {reason}"


# trylast: the innermost wrapper, so plugins that look at the outcome afterwards (the
# lab's reruns) see the failure, not the skip.
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    why = why_required()
    if why is not None:
        fail_skipped(outcome.get_result(), why, "a test")


class StrictXfail:
    """The xfail rule, as a plugin of its own: its report wrapper must run outermost
    (after pytest's xfail handling has marked the report), the skip rule's innermost."""

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
        outcome = yield
        why = why_required()
        if why is not None:
            fail_loose_xfail(item, outcome.get_result(), why)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(StrictXfail(), "rdmad-strict-xfail")


def fail_loose_xfail(item: pytest.Item, report: pytest.TestReport, why: str) -> None:
    """Turn a non-strict expected failure, or an unexpected pass, into a failure."""
    reason = getattr(report, "wasxfail", None)
    if reason is None:
        return
    marker = item.get_closest_marker("xfail")
    strict = (
        bool(marker.kwargs.get("strict", item.config.getini("xfail_strict"))) if marker else False
    )
    if report.passed:
        said = f"an expected failure passed (XPASS): drop its xfail mark ({reason})"
    elif not strict:
        said = f"a non-strict xfail hides a pass as well as a failure: make it strict ({reason})"
    else:
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = f"{why}: {said}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pluggy.Result[pytest.CollectReport], None]:
    outcome = yield
    why = why_required()
    if why is not None:
        fail_skipped(outcome.get_result(), why, "a test module")
