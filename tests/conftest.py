"""Hooks for the whole suite: in a run that must run every test (CI, `.ci/run`), a skip
is a failure (tests/support/required.py). pytester drives pytest itself where a test
checks how a run reports (tests/test_required.py, the lab's rerun rule)."""

from tests.support.required import pytest_make_collect_report, pytest_runtest_makereport

pytest_plugins = ["pytester"]

__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]
