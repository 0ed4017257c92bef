"""Real network namespaces for the kernel tests: a new one of a test's own (deleted
after it, whatever happened), and waiting
for a process started with `ip netns exec NS CMD` to be CMD inside NS (`ip` enters the
namespace, then execs)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def owned_netns() -> Iterator[str]:
    """A new network namespace (``ip netns add``), deleted on the way out (with what
    was made in it), also when the block fails."""
    name = f"rdmad-t-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
