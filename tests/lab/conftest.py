"""Fixtures for the QEMU lab: a shared guest, a fresh guest, failure reports.

Lab tests skip (saying how to enable them) where QEMU, root or the image is
missing; with RDMAD_LAB_REQUIRED=1 (CI) a missing prerequisite fails instead.
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
    """
    for item in items:
        if _in_lab(item):
            item.add_marker(pytest.mark.lab)

    def needs_fresh(item: pytest.Item) -> bool:
        return _in_lab(item) and FRESH_FIXTURE in getattr(item, "fixturenames", ())

    items.sort(key=needs_fresh)  # stable: everything else keeps its order


def _required() -> bool:
    return os.environ.get("RDMAD_LAB_REQUIRED", "") == "1"


@pytest.fixture(scope="session")
def lab_pool() -> Iterator[GuestPool]:
    reason = missing_prerequisite()
    if reason is not None:
        if _required():
            pytest.fail(f"RDMAD_LAB_REQUIRED=1 but the lab cannot run: {reason}", pytrace=False)
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On a failed lab test, attach the guest's serial log and journal."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
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
