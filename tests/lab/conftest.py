"""Fixtures for the QEMU lab: a shared guest, a fresh guest, failure reports.

Lab tests skip (saying how to enable them) where QEMU, root or the image is
missing. In CI (CI=true, as CI systems set it) or with RDMAD_LAB_REQUIRED=1 any
skip of a lab test fails instead: the missing lab prerequisite, and a skip inside
a test (the bond test's kernel module) alike. It is decided here, from the
environment, so it holds for whoever runs pytest and however it is invoked.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parent
# The test modules import `harness` by name: make that work in any import mode.
if str(LAB_DIR) not in sys.path:
    sys.path.insert(0, str(LAB_DIR))

from harness import (  # noqa: E402
    Guest,
    GuestFrozen,
    GuestPool,
    LabError,
    find_image,
    log,
    missing_prerequisite,
)

FRESH_FIXTURE = "fresh_guest"
_POOL_KEY = pytest.StashKey[GuestPool]()


def _in_lab(item: pytest.Item) -> bool:
    return LAB_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark lab tests, and run the ones needing a fresh guest last.

    Only one guest lives at a time, so grouping the shared-guest tests first
    boots the shared guest once instead of after every fresh-guest test.

    A lab test whose guest froze under the emulator (GuestFrozen: the kernel's stall
    report, then a silent guest agent) runs once more on a fresh guest
    (pytest-rerunfailures; the summary counts it as a rerun). Nothing else is rerun:
    any other failure, and a second freeze, fail the run.
    """
    for item in items:
        if _in_lab(item):
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=[GuestFrozen]))

    def needs_fresh(item: pytest.Item) -> bool:
        return _in_lab(item) and FRESH_FIXTURE in getattr(item, "fixturenames", ())

    items.sort(key=needs_fresh)  # stable: everything else keeps its order


def _required() -> bool:
    """A run where the lab must really run: CI, or a caller asking for it."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("RDMAD_LAB_REQUIRED") == "1"


def _why_required() -> str:
    return "CI=true" if os.environ.get("CI", "").lower() == "true" else "RDMAD_LAB_REQUIRED=1"


@pytest.fixture(scope="session")
def lab_pool() -> Iterator[GuestPool]:
    reason = missing_prerequisite()
    if reason is not None:
        if _required():
            pytest.fail(f"{_why_required()} but the lab cannot run: {reason}", pytrace=False)
        pytest.skip(f"lab: {reason}")
    image = find_image()
    assert image is not None  # missing_prerequisite() checked it
    pool = GuestPool(image)
    try:
        yield pool
    finally:
        pool.close()


def _shared_guest(pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    request.node.stash[_POOL_KEY] = pool
    g = pool.shared()
    yield g
    try:
        if g.alive():
            g.reset()
    except LabError as exc:
        log(f"shared guest unusable after {request.node.name}, discarding it: {exc}")
        pool.discard_shared()


@pytest.fixture
def guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """The shared guest. Tests must leave it usable; reset() undoes the usual
    leftovers (VFs, rxe links, netdevsim, vfio bindings, dummy modules)."""
    yield from _shared_guest(lab_pool, request)


@pytest.fixture
def lab_guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """Same as `guest`, under the name other lab test modules ask for."""
    yield from _shared_guest(lab_pool, request)


@pytest.fixture
def fresh_guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """A guest of its own, for tests that reboot or break it."""
    request.node.stash[_POOL_KEY] = lab_pool
    g = lab_pool.fresh()
    yield g
    lab_pool.release_fresh()


# trylast: the innermost wrapper, so a skip made a failure here is a failure when
# pytest-rerunfailures decides on reruns (outside it, the plugin saw a skip and reran it).
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On a failed lab test, attach the guest's serial log and journal."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    _fail_skip_when_required(item, report)
    if report.when not in ("setup", "call") or not report.failed:
        return
    pool = item.stash.get(_POOL_KEY, None)
    g = pool.last if pool is not None else None
    if g is None:
        return
    report.sections.append((f"lab serial log ({g.name}, tail)", g.serial_text(tail=20000)))
    if g.alive():
        try:
            report.sections.append((f"lab journalctl -b ({g.name})", g.journal()))
        except LabError as exc:
            report.sections.append((f"lab journalctl -b ({g.name})", f"unavailable: {exc}"))


def _fail_skip_when_required(item: pytest.Item, report: pytest.TestReport) -> None:
    """Turn a skipped lab test into a failure in a run that requires the lab.

    An expected failure (xfail) also reports as skipped; it is not a skip and stays.
    """
    if not (report.skipped and _in_lab(item) and _required()):
        return
    if hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"{_why_required()}: a lab test may not skip here, but it did: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """The same for a lab module skipped as a whole (importorskip, a module-level skip)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    path = Path(str(collector.path)).resolve()
    if report.skipped and _required() and LAB_DIR in (path, *path.parents):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = f"{_why_required()}: a lab module may not skip here, but did: {reason}"
