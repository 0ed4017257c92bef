"""Hooks for the whole suite: in a run that must run every test (CI, `.ci/run`), a skip
is a failure (tests/support/required.py). pytester drives pytest itself where a test
checks how a run reports (tests/test_required.py, the lab's rerun rule).

Hypothesis runs without its per-example deadline: a time limit is a timing assertion,
which fails on a loaded machine (two cores shared with a QEMU guest) and proves nothing
about the property; slowness is measured under bench/, not asserted here."""

from hypothesis import settings

from tests.support.required import (
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

settings.register_profile("rdmad", deadline=None)
settings.load_profile("rdmad")

pytest_plugins = ["pytester"]

__all__ = ["pytest_configure", "pytest_make_collect_report", "pytest_runtest_makereport"]
