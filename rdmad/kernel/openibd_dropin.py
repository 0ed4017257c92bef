"""rdmad's drop-in for openibd.service on the host: observed, written or removed, and
systemd told (``systemctl daemon-reload``: a drop-in counts only once systemd has read
it). What the drop-in says is ``rdmad.openibd``'s; when it is there is the plan's
(``rdmad.reconcile.guard``): only while a guard is declared and the unit's own stop
is known.
"""

from __future__ import annotations

import asyncio
import os
import shutil

from rdmad.fileio import write_or_remove
from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.observed import OpenibdObserved
from rdmad.openibd import DROPIN, DROPIN_DIR, read_unit_stop, render_dropin

RELOAD_TIMEOUT = 60.0


def observe_openibd(sysfs: Sysfs, guard: str) -> OpenibdObserved:
    stop = read_unit_stop(sysfs)
    on_disk = sysfs.read(DROPIN)
    if on_disk is None:
        dropin = "absent"
    elif stop.commands is not None and on_disk == render_dropin(stop, guard).strip():
        dropin = "current"
    else:
        dropin = "stale"
    return OpenibdObserved(unit=stop.found, unknown=stop.why if stop.found else "", dropin=dropin)


def sync_dropin(sysfs: Sysfs, write: bool, guard: str) -> bool:
    """Write the drop-in from the unit's files as they read now (``write``), or remove it;
    True when the file changed. Raises KernelError when the unit's stop cannot be known
    now (nothing written: a stale drop-in is removed) or the file cannot be written."""
    text: str | None = None
    if write:
        stop = read_unit_stop(sysfs)
        if not stop.found or stop.commands is None:
            write_or_remove(sysfs.path(DROPIN), None)
            why = stop.why or "openibd.service is gone"
            raise KernelError("write the openibd.service drop-in", f"/{DROPIN}", None, why)
        text = render_dropin(stop, guard)
    before = sysfs.read(DROPIN)
    if (before is None and text is None) or (
        before is not None and text is not None and before == text.strip()
    ):
        return False
    path = sysfs.path(DROPIN)
    try:
        if text is not None:
            os.makedirs(sysfs.path(DROPIN_DIR), mode=0o755, exist_ok=True)
        write_or_remove(path, text.encode() if text is not None else None)
    except OSError as exc:
        raise KernelError(
            "write the openibd.service drop-in", f"/{DROPIN}", exc.errno, exc.strerror or ""
        ) from None
    return True


async def daemon_reload() -> None:
    """``systemctl daemon-reload``: systemd reads the drop-in (or its removal). Raises
    KernelError when systemctl is missing, fails or hangs."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise KernelError("systemctl daemon-reload", "systemctl", None, "no systemctl in PATH")
    proc = await asyncio.create_subprocess_exec(
        systemctl,
        "daemon-reload",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), RELOAD_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise KernelError(
            "systemctl daemon-reload", "systemctl", None, f"no answer in {RELOAD_TIMEOUT:g} s"
        ) from None
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        raise KernelError("systemctl daemon-reload", "systemctl", None, said)
