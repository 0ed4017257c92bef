"""The harness tells a guest the emulator froze from a guest that is merely slow.

Only GuestFrozen makes conftest run a lab test once more; these run without QEMU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ExecResult, Guest, GuestAgentSilent, GuestFrozen, LabImage

STALL = (
    "[  610.508869] rcu: rcu_preempt kthread starved for 5252 jiffies! g183633 f0x0 "
    "RCU_GP_WAIT_FQS(5) ->state=0x402 ->cpu=1\n"
)
BANNER = "[    0.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n"


class SilentAgent:
    """A guest agent that never answers."""

    def exec(self, argv: list[str], *, timeout: float, stdin: bytes | None = None) -> ExecResult:
        raise GuestAgentSilent("the guest agent did not answer in time")

    def close(self) -> None:
        pass


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
    guest.serial_log.write_text("watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [sh:1]\n")
    assert guest.kernel_stall() == "watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [sh:1]"
    guest.serial_log.write_text("")
    assert guest.kernel_stall() is None
