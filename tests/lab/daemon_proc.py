"""rdmad's process in a lab guest as systemd and /proc see it: pid, restarts, RSS, fds, status.

Shared by the reliability lab tests and the soak: both kill, restart and sample the
running service and must read the same things the same way.
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness import Guest

UNIT = "rdmad.service"


def unit_props(g: Guest, *names: str) -> dict[str, str]:
    out = g.check(f"systemctl show -p {','.join(names)} {UNIT}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main_pid(g: Guest) -> int:
    return int(unit_props(g, "MainPID")["MainPID"])


def restarts(g: Guest) -> int:
    """systemd's count of automatic restarts (Restart=) of this unit since it was started."""
    return int(unit_props(g, "NRestarts")["NRestarts"])


def wait_restarted(g: Guest, old_pid: int, timeout: float = 240.0) -> int:
    """Wait until systemd has a new rdmad running and READY (ActiveState=active); its pid."""

    def up() -> bool:
        p = unit_props(g, "MainPID", "ActiveState")
        return p["ActiveState"] == "active" and int(p["MainPID"]) not in (0, old_pid)

    g.wait_until(up, timeout=timeout, interval=0.5, what="systemd's restart of rdmad")
    return main_pid(g)


def rss_kib(g: Guest, pid: int) -> int:
    """VmRSS of pid in KiB (the kernel's own figure)."""
    line = g.check(f"grep '^VmRSS:' /proc/{pid}/status")
    return int(line.split()[1])


def rss_parts_kib(g: Guest, pid: int) -> dict[str, int]:
    """RssAnon, RssFile and RssShmem of pid in KiB: a heap that grows shows in the first;
    shared libraries and files paged in as code runs for the first time, in the second."""
    out = g.check(f"grep -E '^Rss(Anon|File|Shmem):' /proc/{pid}/status")
    return {line.split(":")[0]: int(line.split()[1]) for line in out.splitlines() if line}


def thread_count(g: Guest, pid: int) -> int:
    """Threads of pid (the kernel's count: Python's and any a library started)."""
    line = g.check(f"grep '^Threads:' /proc/{pid}/status")
    return int(line.split()[1])


def fd_count(g: Guest, pid: int) -> int:
    return int(g.check(f"ls /proc/{pid}/fd | wc -l").strip())


def status_doc(g: Guest) -> dict[str, Any]:
    """`rdmad-ctl status --json` (exit 0 converged, 1 not: both carry the document)."""
    res = g.run(["rdmad-ctl", "status", "--json"], timeout=60)
    assert res.rc in (0, 1), res.describe()
    return dict(json.loads(res.out))


def wait_converged(g: Guest, within: float = 180.0) -> float:
    """Until rdmad says the node is converged, as a unit ordered after
    rdmad-wait-converged.service waits: `rdmad-ctl wait`, one process the daemon answers
    when a pass gets there (a poll of `rdmad-ctl status` is a Python start-up each time,
    on the guest's own vCPU). Needs rdmad up (after READY=1). Returns the seconds waited."""
    started = time.monotonic()
    res = g.run(["rdmad-ctl", "wait", "--within", f"{within:g}"], timeout=within + 60)
    assert res.rc == 0, f"not converged within {within:g} s:\n{res.describe()}"
    return time.monotonic() - started


def source_notes(doc: dict[str, Any]) -> list[str]:
    """Status notes saying an event source ended or failed (rdmad then relies on drift)."""
    return [n for n in doc["daemon"]["notes"] if "event source" in n]


def journal_since(g: Guest, since: int) -> str:
    """rdmad's log across every run of the unit since guest time `since` (epoch seconds)."""
    return g.check(f"journalctl --no-pager -o cat -u {UNIT} --since @{since}", timeout=120)


def guest_epoch(g: Guest) -> int:
    return int(g.check("date +%s").strip())
