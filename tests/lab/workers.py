"""The lab on several pytest-xdist workers: each worker has its own guest pool, and a
test marked ``lab_alone`` runs while no other worker runs a lab test.

Two guests at once give ~1.5x the throughput of one on two host cores (a guest spends
much of a test waiting), but they share those cores: a test whose figures depend on
having the guest's CPUs (the fd flood's answer times, the SIGKILL points that land
inside a write) asks to run alone. The rule is a readers-writer lock on a file every
worker of the run opens (fcntl.flock: the kernel drops it with the process, so a
killed worker never leaves it held): a lab test holds it shared, a ``lab_alone`` test
exclusively, from its fixtures' setup to their teardown. A turnstile lock in front of
it keeps a waiting ``lab_alone`` test from being starved: once it waits, the next test
of the other worker waits behind it. The other worker's guest stays up, idle.

Without xdist (one worker, or a plain ``pytest`` run) there is nothing to wait for and
no file is made.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import WORKDIR_PREFIX, log

ALONE_MARK = "lab_alone"
_TURNSTILE = "turnstile.lock"
_TESTS = "tests.lock"


def run_directory() -> Path | None:
    """The directory the workers of this xdist run share (made on first use), or None
    outside xdist. Named after the run, owned by the controller (the workers' parent):
    remove_stale_workdirs() removes it once that process is gone."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or "PYTEST_XDIST_WORKER" not in os.environ:
        return None
    directory = Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}run-{run}"
    directory.mkdir(exist_ok=True)
    (directory / "owner.pid").write_text(str(os.getppid()))
    return directory


def worker_name() -> str | None:
    """This process's xdist worker id (gw0, gw1, ...), or None outside xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER")


@contextmanager
def turn(directory: Path | None, *, alone: bool, what: str) -> Iterator[None]:
    """Hold the run's test lock (exclusively when ``alone``) for the block; logs a wait
    that took more than a second, so a slow start says why."""
    if directory is None:
        yield
        return
    with (
        open(directory / _TURNSTILE, "a") as turnstile,
        open(directory / _TESTS, "a") as tests,
    ):
        started = time.monotonic()
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        waited = time.monotonic() - started
        if waited > 1.0:
            why = "the other workers' tests to end" if alone else "a test that runs alone"
            log(f"{what}: waited {waited:.0f} s for {why}")
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)


def beside(directory: Path | None, what: str, make: Callable[[], object]) -> bool:
    """Run ``make`` holding the run's test lock shared (other workers' tests go on), for
    work a test would otherwise do in its own turn. A failure is said, not raised: this
    runs in pytest's protocol hook, where an exception ends the whole run (INTERNALERROR)
    instead of failing one test; the test's own fixture does the work again and reports
    it as that test's error. True when ``make`` returned."""
    try:
        with turn(directory, alone=False, what=what):
            make()
    except Exception as exc:
        log(f"{what}: failed ({type(exc).__name__}: {exc}); the test's setup tries again")
        return False
    return True
