"""Processes a test started: ended by their pid, even when the test failed."""

from __future__ import annotations

import subprocess


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill (and wait for) a daemon a test left running: a failed test leaves no process."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
