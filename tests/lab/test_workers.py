"""workers.py's test lock (host-side: no guest): lab tests of several xdist workers
share it, a lab_alone test holds it alone, and a waiting lab_alone test is not starved.

Threads stand for workers: flock locks belong to open file descriptions, and each
turn() opens its own. A wait is shown by the lock's state (a non-blocking flock that
fails), never by time passing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from workers import beside, run_directory, turn

BOUND = 30.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"not within {BOUND} s: {what}"
        time.sleep(0.01)


def held(path: Path, mode: int) -> bool:
    """Whether someone holds ``path`` against a ``mode`` request (non-blocking probe)."""
    with open(path, "a") as probe:
        try:
            fcntl.flock(probe, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


class Worker(threading.Thread):
    """One turn() in a thread: entered when inside, leaves when told."""

    def __init__(self, directory: Path, *, alone: bool, name: str, order: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.directory, self.alone, self.order = directory, alone, order
        self.entered = threading.Event()
        self.leave = threading.Event()

    def run(self) -> None:
        with turn(self.directory, alone=self.alone, what=self.name):
            self.order.append(self.name)
            self.entered.set()
            self.leave.wait(BOUND)


def test_outside_xdist_there_is_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    assert run_directory() is None
    with turn(None, alone=True, what="t"):
        pass


def test_a_workers_run_directory_is_the_runs_and_its_owner_the_controller(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "0123abcd")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directory = run_directory()
    assert directory == tmp_path / "rdmad-lab-run-0123abcd"
    assert (directory / "owner.pid").read_text() == str(os.getppid())


def test_shared_tests_run_together_and_an_alone_test_waits_for_them(tmp_path: Path) -> None:
    order: list[str] = []
    a = Worker(tmp_path, alone=False, name="a", order=order)
    b = Worker(tmp_path, alone=False, name="b", order=order)
    a.start()
    b.start()
    try:
        assert a.entered.wait(BOUND) and b.entered.wait(BOUND)  # both inside at once
        alone = Worker(tmp_path, alone=True, name="alone", order=order)
        alone.start()
        # It waits on the test lock, holding the turnstile: a shared test now waits too.
        wait_until(lambda: held(tmp_path / "turnstile.lock", fcntl.LOCK_EX), "alone queued")
        assert not alone.entered.is_set()
        late = Worker(tmp_path, alone=False, name="late", order=order)
        late.start()
        a.leave.set()
        a.join(BOUND)
        assert not alone.entered.is_set() and held(tmp_path / "tests.lock", fcntl.LOCK_EX)
        b.leave.set()
        assert alone.entered.wait(BOUND)
        # Alone inside: the late shared test is held off by the lock, not by chance.
        assert held(tmp_path / "tests.lock", fcntl.LOCK_SH)
        assert not late.entered.is_set()
        alone.leave.set()
        assert late.entered.wait(BOUND)
        late.leave.set()
    finally:
        for w in (a, b):
            w.leave.set()
    assert order[2:] == ["alone", "late"], order


def test_work_beside_the_others_holds_the_lock_shared_and_a_failure_ends_only_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """beside() runs in pytest's protocol hook: a failure there must not end the run
    (INTERNALERROR), only be said, so the test's own setup makes the state and reports."""
    seen: list[tuple[bool, bool]] = []

    def make() -> None:  # others may hold it shared beside; nobody alone
        seen.append(
            (
                held(tmp_path / "tests.lock", fcntl.LOCK_EX),
                held(tmp_path / "tests.lock", fcntl.LOCK_SH),
            )
        )

    assert beside(tmp_path, "t1 (its saved states)", make) is True
    assert seen == [(True, False)]

    def broken() -> None:
        raise OSError("qemu-img: no space left on device")

    assert beside(tmp_path, "t2 (its saved states)", broken) is False
    err = capsys.readouterr().err
    assert "t2 (its saved states): failed (OSError: qemu-img: no space left on device)" in err
    assert not held(tmp_path / "tests.lock", fcntl.LOCK_EX), "the lock outlived the failure"
    with pytest.raises(KeyboardInterrupt):  # an interrupt still ends the run
        beside(tmp_path, "t3", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
