"""Fixtures for the QEMU lab: a shared guest, a fresh guest, failure reports, reruns.

Lab tests skip (saying how to enable them) where QEMU, root or the image is
missing. In a run that must run every test (`.ci/run`, any truthy CI: see
tests/support/required.py) or with RDMAD_LAB_REQUIRED=1 any skip of a lab test
fails instead: the missing lab prerequisite, and a skip inside a test (the bond
test's kernel module) alike. It is decided from the environment, so it holds for
whoever runs pytest and however it is invoked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.required import fail_skipped, why_required

LAB_DIR = Path(__file__).resolve().parent
# The test modules import `harness` by name: make that work in any import mode.
if str(LAB_DIR) not in sys.path:
    sys.path.insert(0, str(LAB_DIR))

from harness import (  # noqa: E402
    ALONE_CPUS,
    BESIDE_CPUS,
    Guest,
    GuestFrozen,
    GuestPool,
    LabError,
    find_image,
    missing_prerequisite,
)
from workers import ALONE_MARK, beside, run_directory, turn  # noqa: E402

# The fixtures of tests that reboot or break their guest: the longest ones.
LONG_FIXTURES = ("fresh_guest", "installed_guest")
# The fixtures whose guest starts from the installed state (the rest: the clean one).
INSTALLED_FIXTURES = frozenset({"guest", "lab_guest", "installed_guest"})
# What a guest test says it needs (pytest.mark.lab_needs(...)); unmarked: "state".
# "state": its guest may start from a saved state; "boot": it must really boot (never
# a state); "reboot": the test reboots it. Checked after the test (_check_declared).
NEEDS_MARK = "lab_needs"
# A test whose node has no emulated igb NIC (pytest.mark.lab_no_igb): booted, never
# from a saved state (those have it), so it declares lab_needs("boot").
NO_IGB_MARK = "lab_no_igb"
NEEDS = frozenset({"state", "boot", "reboot"})
LAB_REQUIRED_ENV = "RDMAD_LAB_REQUIRED"
_POOL_KEY = pytest.StashKey[GuestPool]()
# The exceptions of this attempt's failed phases, in order (None: a failure without one).
_FAILURES = pytest.StashKey[list[BaseException | None]]()


def _in_lab(item: pytest.Item) -> bool:
    return LAB_DIR in Path(str(item.path)).resolve().parents


def _has_guest(item: pytest.Item) -> bool:
    """Whether the test's fixtures (all of them, through their own) start lab guests."""
    return "lab_pool" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark lab tests; run the ones that reboot or break their guest first and the
    ``lab_alone`` ones last.

    Every guest test has a guest of its own, so the order changes no outcome. Tests of
    ``fresh_guest`` and ``installed_guest`` are the longest: started first, the xdist
    workers (``--maxschedchunk=1``: each takes the next test when it is free) end
    together instead of one waiting on a last reboot. A ``lab_alone`` test waits for
    the other workers' current tests to end: at the end of the run those are short.

    A lab test whose guest froze under the emulator (GuestFrozen: the kernel's RCU
    stall report, then a silent guest agent) runs once more on a fresh guest
    (pytest-rerunfailures; the summary counts it as a rerun), but only when the freeze
    is the attempt's first failure (see rerun_condition). Nothing else is rerun: any
    other failure, a soft lockup (GuestKernelHang) and a second freeze fail the run.
    """
    for item in items:
        if _in_lab(item):
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.flaky(reruns=1, condition=rerun_condition(item)))

    def rank(item: pytest.Item) -> int:
        if not _in_lab(item):
            return 1
        if item.get_closest_marker(ALONE_MARK) is not None:
            return 2
        names = getattr(item, "fixturenames", ())
        boots = needs(item) & {"boot", "reboot"}
        return 0 if boots or any(f in names for f in LONG_FIXTURES) else 1

    items.sort(key=rank)  # stable: everything else keeps its order


def rerun_condition(item: pytest.Item) -> Callable[[BaseException | None], bool]:
    """pytest-rerunfailures' ``condition`` for ``item``: rerun when the failure it is
    asked about is the attempt's first one and an emulator freeze that met no earlier
    failure.

    Its ``only_rerun`` is not enough: it matches the whole exception chain, so an
    assertion that failed and then met a freeze in an ``except: log(status); raise``
    handler (the freeze's ``__context__`` is the assertion) was rerun, and a pass hid
    it. Here the freeze must come first: in the test (``GuestFrozen.met`` is None: the
    harness was not called while a failure was being handled), and in the attempt (no
    earlier phase failed, and an assertion made after catching a freeze is not one).
    """

    def first_failure_is_a_freeze(error: BaseException | None) -> bool:
        failures = item.stash.get(_FAILURES, [])
        return (
            bool(failures)
            and error is not None
            and failures[0] is error
            and isinstance(error, GuestFrozen)
            and error.met is None
        )

    return first_failure_is_a_freeze


def _why_required() -> str | None:
    """Why the lab must really run here (``NAME=value``), or None."""
    return why_required(LAB_REQUIRED_ENV)


def _pool(cpus: int) -> Iterator[GuestPool]:
    reason = missing_prerequisite()
    if reason is not None:
        why = _why_required()
        if why is not None:
            pytest.fail(f"{why} but the lab cannot run: {reason}", pytrace=False)
        pytest.skip(f"lab: {reason}")
    image = find_image()
    assert image is not None  # missing_prerequisite() checked it
    pool = GuestPool(image, cpus=cpus)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def lab_pool() -> Iterator[GuestPool]:
    """The worker's guests for tests that run beside another worker's: one vCPU each
    (harness.BESIDE_CPUS says why)."""
    yield from _pool(BESIDE_CPUS)


# The worker's pool for lab_alone tests, made on first use: by the fixture, or earlier by
# _alone_states() before the first such test takes the run's lock alone.
_ALONE_POOL: list[GuestPool] = []


def _alone_pool() -> GuestPool | None:
    if not _ALONE_POOL:
        image = find_image() if missing_prerequisite() is None else None
        if image is None:
            return None  # the fixture says why (skip, or a failure under CI)
        _ALONE_POOL.append(GuestPool(image, cpus=ALONE_CPUS))
    return _ALONE_POOL[0]


@pytest.fixture(scope="session")
def lab_pool_alone() -> Iterator[GuestPool]:
    """The worker's guests for ``lab_alone`` tests: two vCPUs, the host to themselves
    (their figures were measured so)."""
    if _alone_pool() is None:
        yield from _pool(ALONE_CPUS)  # skips or fails, saying why
        return
    try:
        yield _ALONE_POOL[0]
    finally:
        _ALONE_POOL.pop().close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pool made for an alone test's states whose test never asked for it."""
    while _ALONE_POOL:
        _ALONE_POOL.pop().close()


def _alone_states(item: pytest.Item) -> None:
    """Make the saved states a lab_alone test's guest will start from, while other
    tests still run: a new .deb (every commit) or harness means an installed state of
    two vCPUs to make (a restore, an install, a save: ~15-30 s), and made inside the
    alone turn it left the other worker's core idle for that long. Made (or found)
    here, the test's own start is a restore. A boot-declaring test uses none."""
    if "boot" in needs(item):
        return
    pool = _alone_pool()
    if pool is None:
        return
    if INSTALLED_FIXTURES & set(getattr(item, "fixturenames", ())):
        pool.installed_boot()
    else:
        pool.saved_boot()


def needs(item: pytest.Item) -> frozenset[str]:
    """What the test says its guest needs (``lab_needs``): "state" unless marked."""
    marker = item.get_closest_marker(NEEDS_MARK)
    kinds = frozenset(marker.args) if marker is not None else frozenset({"state"})
    unknown = kinds - NEEDS
    if unknown or not kinds:
        raise pytest.UsageError(
            f"{item.nodeid}: lab_needs({', '.join(map(repr, sorted(kinds)))}): "
            f"each must be one of {', '.join(sorted(NEEDS))}"
        )
    return kinds


def _own_guest(
    pool: GuestPool, request: pytest.FixtureRequest, *, installed: bool
) -> Iterator[Guest]:
    if request.node.get_closest_marker(ALONE_MARK) is not None:
        pool = request.getfixturevalue("lab_pool_alone")
    request.node.stash[_POOL_KEY] = pool
    declared = needs(request.node)
    igb = request.node.get_closest_marker(NO_IGB_MARK) is None
    if not igb and "boot" not in declared:
        raise pytest.UsageError(f"{request.node.nodeid}: lab_no_igb needs lab_needs('boot')")
    g = pool.fresh(installed=installed, cold="boot" in declared, igb=igb)
    if "boot" in declared and installed:
        report = g.install_rdmad()
        if not report.compiled:
            raise LabError(f"installing rdmad failed:\n{report.output[-3000:]}")
    yield g
    try:
        if not request.node.stash.get(_FAILURES, []):  # a failed test may not have got there
            _check_declared(request.node.nodeid, declared, g)
    finally:
        pool.release_fresh()


def _check_declared(nodeid: str, declared: frozenset[str], g: Guest) -> None:
    """A test's lab_needs is what its guest went through: a declared boot was one (not a
    saved state), a declared reboot happened, and no reboot went undeclared."""
    if "boot" in declared and g.saved is not None:
        raise LabError(f"{nodeid} declares a boot but its guest started from a saved state")
    if "reboot" in declared and g.reboots == 0:
        raise LabError(
            f"{nodeid} declares lab_needs('reboot') but its guest never rebooted: "
            "a state does (drop the mark), or the test lost its reboot"
        )
    if "reboot" not in declared and g.reboots > 0:
        raise LabError(
            f"{nodeid} rebooted its guest {g.reboots} time(s) without declaring it: "
            "mark it lab_needs('reboot') (it then runs among the first)"
        )


@pytest.fixture
def guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """A guest of this test's own with rdmad's .deb installed as install_rdmad() leaves
    it, started from the pool's saved installed state (a second or two) and stopped
    after the test: no test sees what an earlier one left, whatever the order.

    Its QEMU is killed after the test, so nothing is cleaned up in it: a fixture or a
    test that stops rdmad or deletes what it made at the end only spends guest time
    (measured: ~1 min of the lab's two workers before such teardowns went)."""
    yield from _own_guest(lab_pool, request, installed=True)


@pytest.fixture
def lab_guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """Same as `guest`, under the name other lab test modules ask for."""
    yield from _own_guest(lab_pool, request, installed=True)


@pytest.fixture
def installed_guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """The same guest as `guest`, named for a test that reboots or breaks it: such tests
    are the longest and run first (see pytest_collection_modifyitems)."""
    yield from _own_guest(lab_pool, request, installed=True)


@pytest.fixture
def fresh_guest(lab_pool: GuestPool, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """A guest of its own as booted: nothing has happened in it (rdmad not installed,
    no module loaded since the boot)."""
    yield from _own_guest(lab_pool, request, installed=False)


# trylast: an inner wrapper, so a skip made a failure here is a failure, and the first
# failure is recorded, when pytest-rerunfailures decides on reruns (outside it, the
# plugin saw a skip and reran it).
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Record the attempt's failures (for rerun_condition); on a failed lab test, attach
    the guest's serial log and journal."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not _in_lab(item):
        return
    why = _why_required()
    if why is not None:
        fail_skipped(report, why, "a lab test")
    if report.when == "setup":
        item.stash[_FAILURES] = []
    if report.failed:
        error = call.excinfo.value if call.excinfo is not None else None
        item.stash.setdefault(_FAILURES, []).append(error)
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    """Under pytest-xdist, a lab test with a guest (its setup, reruns and teardown
    included) holds the run's test lock: shared, or alone for a test marked
    ``lab_alone`` (workers.py); before an alone one takes it, its saved states are
    made holding it shared (_alone_states; a failure there becomes the test's own setup
    error, not the run's end). Host-side tests of the harness hold nothing: they start
    no guest and time nothing. Outside xdist this is a no-op."""
    if not _in_lab(item) or not _has_guest(item):
        yield
        return
    alone = item.get_closest_marker(ALONE_MARK) is not None
    directory = run_directory()
    if alone and directory is not None:
        beside(directory, f"{item.nodeid} (its saved states)", lambda: _alone_states(item))
    with turn(directory, alone=alone, what=item.nodeid):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """The same for a lab module skipped as a whole (importorskip, a module-level skip)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    path = Path(str(collector.path)).resolve()
    why = _why_required()
    if why is not None and LAB_DIR in (path, *path.parents):
        fail_skipped(report, why, "a lab module")
