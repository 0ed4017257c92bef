"""The harness tells a guest the emulator froze from a guest that is merely slow, or
whose kernel hung.

Only a GuestFrozen that is a test's first failure makes conftest run a lab test once
more; these run without QEMU (the rerun rule through pytester, with conftest.py's
own code).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import harness
import pytest
from harness import (
    ExecResult,
    Guest,
    GuestAgent,
    GuestAgentSilent,
    GuestBootStuck,
    GuestFrozen,
    GuestKernelHang,
    LabImage,
)

STALL = (
    "[  610.508869] rcu: rcu_preempt kthread starved for 5252 jiffies! g183633 f0x0 "
    "RCU_GP_WAIT_FQS(5) ->state=0x402 ->cpu=1\n"
)
BANNER = "[    0.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n"
LOCKUP = "[  640.112233] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [modprobe:312]\n"


class SilentAgent:
    """A guest agent that never answers."""

    def exec(self, argv: list[str], *, timeout: float, stdin: bytes | None = None) -> ExecResult:
        raise GuestAgentSilent("the guest agent did not answer in time")

    def sync(self, timeout: float) -> None:
        raise GuestAgentSilent("the guest agent did not answer in time")

    def close(self) -> None:
        pass


class JobsAgent(SilentAgent):
    """A guest agent that answers: systemd still waits for a unit."""

    def sync(self, timeout: float) -> None:
        pass

    def exec(self, argv: list[str], *, timeout: float, stdin: bytes | None = None) -> ExecResult:
        return ExecResult(0, "JOB UNIT TYPE STATE\n12 lab-restore.service start running\n", "")


@pytest.fixture
def guest(tmp_path: Path) -> Iterator[Guest]:
    g = Guest(LabImage(tmp_path), name="t")  # never booted: close() only removes its dir
    g.agent = SilentAgent()  # type: ignore[assignment]
    yield g
    g.close()


def test_a_silent_agent_with_a_kernel_stall_report_is_a_frozen_guest(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + "booted\n" + STALL + "more\n")
    with pytest.raises(GuestFrozen, match="kthread starved for 5252 jiffies"):
        guest.run("true")


def test_a_silent_agent_without_a_stall_report_is_not(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + "booted\n")
    with pytest.raises(GuestAgentSilent) as exc:
        guest.run("true")
    assert not isinstance(exc.value, GuestFrozen)


def test_a_stall_from_before_the_last_reboot_does_not_count(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + STALL + BANNER + "booted again\n")
    assert guest.kernel_stall() is None
    with pytest.raises(GuestAgentSilent) as exc:
        guest.run("true")
    assert not isinstance(exc.value, GuestFrozen)


def test_stall_reports_are_found_in_a_log_without_a_banner(guest: Guest) -> None:
    guest.serial_log.write_text("rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n")
    assert guest.kernel_stall() == "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:"
    guest.serial_log.write_text("")
    assert guest.kernel_stall() is None


def test_a_soft_lockup_is_a_kernel_hang_not_a_frozen_emulator(guest: Guest) -> None:
    # A task held a CPU in the kernel (here modprobe, as when rdmad loads a driver); the
    # RCU stall report that follows it does not make it an emulator freeze.
    guest.serial_log.write_text(BANNER + "booted\n" + LOCKUP + STALL)
    assert guest.kernel_stall() is not None
    assert guest.kernel_lockup() == LOCKUP.split("] ", 1)[1].strip()
    with pytest.raises(GuestKernelHang, match=r"soft lockup .*\[modprobe:312\]") as exc:
        guest.run("rdmad-ctl status")
    assert not isinstance(exc.value, GuestFrozen | GuestAgentSilent)
    assert "not an emulator freeze" in str(exc.value)


def test_a_boot_with_a_soft_lockup_is_a_kernel_hang(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + LOCKUP)  # no boot-done marker
    with pytest.raises(GuestKernelHang, match="no boot-done marker") as exc:
        guest.wait_boot(0.0, started=time.monotonic())
    assert not isinstance(exc.value, GuestFrozen)


def test_a_freeze_met_while_handling_a_failure_names_it(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + STALL)
    try:
        raise AssertionError("VF 1 still on vfio-pci")
    except AssertionError:
        with pytest.raises(GuestFrozen) as exc:
            guest.run("rdmad-ctl status")  # the status an `except: log(...)` asks for
        failure = sys.exception()
    assert exc.value.met is failure
    assert "after an earlier failure: AssertionError: VF 1 still on vfio-pci" in str(exc.value)
    with pytest.raises(GuestFrozen) as clean:
        guest.run("true")
    assert clean.value.met is None


class StalledExecAgent(GuestAgent):
    """guest-exec starts the command; guest-exec-status answers only `answers` times
    out of the calls listed in `script` (True: an answer, False: silence)."""

    def __init__(self, script: list[bool], silent_call: Callable[[], None] | None = None) -> None:
        super().__init__(Path("/nonexistent"))
        self.script = script
        self.status_calls = 0
        # What a silent call costs: by default a short real wait.
        self.silent_call = silent_call or (lambda: time.sleep(0.01))

    def call(
        self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> Any:
        if command == "guest-exec":
            return {"pid": 7}
        answers = self.script[min(self.status_calls, len(self.script) - 1)]
        self.status_calls += 1
        if not answers:
            self.silent_call()  # a silent agent's call takes its timeout
            raise GuestAgentSilent("the guest agent did not answer in time")
        return {"exited": self.status_calls >= len(self.script), "exitcode": 0}


def test_a_long_command_gives_up_after_the_silence_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # A benchmark's driver may run for hours; a frozen guest must not hold it that long.
    monkeypatch.setattr(harness, "AGENT_SILENCE_LIMIT", 0.05)
    agent = StalledExecAgent([False])
    with pytest.raises(GuestAgentSilent, match=r"did not answer for \d+ s while /bin/sh ran"):
        agent.exec(["/bin/sh", "-c", "sleep 3600"], timeout=7200)
    assert agent.status_calls >= 2  # it asked again before giving up


def test_silence_counts_from_the_first_unanswered_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each unanswered status call takes its 30 s timeout on a fake clock: the limit is
    # reached when the fifth one ends (5 x 30 s), not one call later.
    clock = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds

    agent = StalledExecAgent([False], silent_call=lambda: sleep(30.0))
    fake_time = SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep, strftime=time.strftime)
    monkeypatch.setattr(harness, "time", fake_time)
    with pytest.raises(GuestAgentSilent, match=r"did not answer for 150 s"):
        agent.exec(["/bin/sh", "-c", "sleep 3600"], timeout=7200)
    assert agent.status_calls == 5


def test_a_short_silence_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "AGENT_SILENCE_LIMIT", 60.0)
    agent = StalledExecAgent([False, True, False, True])
    assert agent.exec(["/bin/true"], timeout=7200).ok
    assert agent.status_calls == 4


def test_a_boot_that_stalls_is_a_frozen_guest(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + STALL)  # no boot-done marker
    with pytest.raises(GuestFrozen, match="no boot-done marker after 0 s"):
        guest.wait_boot(0.0, started=time.monotonic())


def test_a_boot_that_is_only_slow_is_not(guest: Guest) -> None:
    guest.serial_log.write_text(BANNER + "still starting\n")
    with pytest.raises(GuestBootStuck) as exc:
        guest.wait_boot(0.0, started=time.monotonic())
    assert not isinstance(exc.value, GuestFrozen)
    assert "still starting" in str(exc.value)
    assert "systemd's pending jobs: the guest agent did not answer" in str(exc.value)


def test_a_stuck_boot_says_what_systemd_waits_for(guest: Guest) -> None:
    guest.agent = JobsAgent()  # type: ignore[assignment]
    guest.serial_log.write_text(BANNER + "login prompt\n")
    with pytest.raises(GuestBootStuck, match=r"lab-restore\.service start running"):
        guest.wait_boot(0.0, started=time.monotonic())


# --- which failures conftest runs again (pytester, with conftest.py's own code) --------

LAB_DIR = Path(__file__).resolve().parent

# Each inner test fails on its first attempt only: a rerun shows as "1 passed, 1 rerun",
# no rerun as "1 failed".
INNER_PRELUDE = f'''
import sys
from pathlib import Path

import pytest
from harness import ExecResult, Guest, GuestAgentSilent, GuestFrozen, LabImage

STALL = {STALL!r}
LOCKUP = {LOCKUP!r}
BANNER = {BANNER!r}
ATTEMPTS = []


class SilentAgent:
    def exec(self, argv, *, timeout, stdin=None):
        raise GuestAgentSilent("the guest agent did not answer in time")

    def close(self):
        pass


@pytest.fixture
def frozen(tmp_path):
    """A guest whose agent is silent and whose console says what the kernel reported."""
    g = Guest(LabImage(tmp_path), name="t")
    g.agent = SilentAgent()
    g.serial_log.write_text(BANNER + STALL)
    yield g
    g.close()


def first_attempt():
    ATTEMPTS.append(1)
    return len(ATTEMPTS) == 1
'''

INNER_CASES = {
    "a freeze as the first failure": """
def test_it(frozen):
    if first_attempt():
        frozen.run("rdmad-ctl status")
""",
    "an assertion, then a freeze in its except handler": """
def test_it(frozen):
    if first_attempt():
        try:
            assert False, "VF 1 still on vfio-pci"
        except AssertionError:
            print(frozen.run("rdmad-ctl status").out)  # except: log(status); raise
            raise
""",
    "an assertion whose __context__ is a freeze": """
def test_it(frozen):
    if first_attempt():
        try:
            frozen.run("rdmad-ctl status")
        except GuestFrozen:
            assert False, "status did not answer"
""",
    "a soft lockup while rdmad acts": """
def test_it(frozen):
    frozen.serial_log.write_text(BANNER + LOCKUP + STALL)
    if first_attempt():
        frozen.run("modprobe igb")
""",
    "an assertion, then a freeze in teardown": """
@pytest.fixture
def stops_rdmad(frozen):
    yield
    frozen.run("systemctl stop rdmad")


def test_it(frozen, stops_rdmad):
    if first_attempt():
        assert False, "VF 1 still on vfio-pci"
    frozen.serial_log.write_text(BANNER)  # no freeze on the second attempt
""",
}


def run_inner(pytester: pytest.Pytester, case: str) -> tuple[dict[str, int], str]:
    # The inner run's conftest is the lab's own, so LAB_DIR is the inner directory and
    # its tests are lab tests.
    pytester.makeconftest((LAB_DIR / "conftest.py").read_text())
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    lab: lab test\n"
    )
    pytester.makepyfile(test_case=INNER_PRELUDE + INNER_CASES[case])
    with pytest.MonkeyPatch.context() as env:
        # The inner run is not one of the outer run's xdist workers: it must not take
        # their lock (workers.py), whatever its tests ask for.
        env.delenv("PYTEST_XDIST_WORKER", raising=False)
        result = pytester.runpytest("-p", "no:cacheprovider", "-rR")
    return result.parseoutcomes(), result.stdout.str()


def test_a_freeze_as_the_first_failure_is_rerun(pytester: pytest.Pytester) -> None:
    outcomes, out = run_inner(pytester, "a freeze as the first failure")
    assert outcomes == {"passed": 1, "rerun": 1}, out


@pytest.mark.parametrize(
    "case",
    [
        "an assertion, then a freeze in its except handler",
        "an assertion whose __context__ is a freeze",
        "a soft lockup while rdmad acts",
        "an assertion, then a freeze in teardown",
    ],
)
def test_a_failure_before_the_freeze_or_a_hang_is_not_rerun(
    pytester: pytest.Pytester, case: str
) -> None:
    outcomes, out = run_inner(pytester, case)
    assert outcomes.get("rerun", 0) == 0 and outcomes.get("failed", 0) == 1, out


@pytest.mark.parametrize(
    "error",
    [
        harness.GuestFrozen("froze in a boot: rcu_preempt detected stalls"),
        harness.GuestAgentSilent("no answer for 150 s"),
        harness.GuestBootStuck("no boot-done marker"),
    ],
    ids=["frozen", "silent", "stuck-boot"],
)
def test_a_script_whose_guest_froze_or_stopped_exits_to_be_run_again(
    error: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    """Benchmarks and the demo (lab_script_exit): a frozen or silent guest says nothing
    about rdmad, so bench/run.py runs the script once more; a GuestFrozen from a boot
    escaped this before and failed a CI run."""

    def main() -> int:
        raise error

    assert harness.lab_script_exit(main) == harness.EXIT_GUEST_STOPPED
    assert str(error) in capsys.readouterr().err


def test_a_kernel_hang_in_a_script_is_a_finding() -> None:
    def main() -> int:
        raise harness.GuestKernelHang("soft lockup")

    with pytest.raises(harness.GuestKernelHang):
        harness.lab_script_exit(main)
    assert harness.lab_script_exit(lambda: 0) == 0
