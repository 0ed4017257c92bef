"""Waiting for a process started with `ip netns exec NS CMD` to be CMD inside NS (the
kernel tests that name real namespaces): `ip` enters the namespace, then execs."""

from __future__ import annotations

import os
import time
from pathlib import Path


def wait_entered(pid: int, ns: str, comm: str = "sleep", timeout: float = 10.0) -> None:
    """Until /proc/PID is COMM in /run/netns/NS, bounded by ``timeout``."""
    target = os.stat(f"/run/netns/{ns}").st_ino
    deadline = time.monotonic() + timeout
    while (
        os.stat(f"/proc/{pid}/ns/net").st_ino != target
        or Path(f"/proc/{pid}/comm").read_text().strip() != comm
    ):
        assert time.monotonic() < deadline, f"ip netns exec did not run {comm} in {ns}"
        time.sleep(0.02)
