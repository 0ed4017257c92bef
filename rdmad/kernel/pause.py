"""The pause file: a guarded stop of the RDMA stack is in progress, rdmad stands back.

An operator's `modprobe -r` of a guarded driver, `systemctl stop openibd` or
`rdmad-ctl pause` writes ``/run/rdmad/pause.json`` before anything is unloaded. While
it is in force the planner loads no module and creates no rxe link (reloading
``rdma_rxe`` the moment it goes would make the stop fail with "module in use").

It ends by itself, whichever comes first:

* at ``until`` (bounded by ``MAX_PAUSE``: a wall clock stepped back cannot pause
  rdmad for days);
* when the stack is back: one of the named modules is loaded again. A module is
  identified by the inode of its ``/sys/module/NAME`` directory, which the kernel
  creates anew at every load, so an unload and reload between two passes is seen
  too. A module not loaded when the pause began counts as back once it is loaded.

Written by the guard (a short-lived root process, from modprobe) and by the daemon's
API, read by every observation: a small JSON file written atomically, never locked.
Standard library only: the guard imports this inside `modprobe -r`.
"""

from __future__ import annotations

import json
import os

from rdmad.fileio import write_atomic
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.observed import PauseObserved

PAUSE_FILE = "run/rdmad/pause.json"
DEFAULT_PAUSE = 120.0  # an openibd restart or a driver reload takes seconds to a minute
MAX_PAUSE = 3600.0


def module_identity(sysfs: Sysfs, module: str) -> int | None:
    """The inode of /sys/module/NAME while the module is loaded (or built in), else None."""
    name = module.replace("-", "_")
    if sysfs.read(f"sys/module/{name}/initstate") not in (None, "live"):
        return None  # coming or going
    try:
        return os.stat(sysfs.path(f"sys/module/{name}")).st_ino
    except OSError:
        return None


def write_pause(
    sysfs: Sysfs, *, by: str, reason: str, seconds: float, modules: list[str], now: float
) -> PauseObserved:
    """Start (or replace) the pause; raises OSError when the file cannot be written."""
    seconds = max(1.0, min(float(seconds), MAX_PAUSE))
    record = {
        "by": by,
        "reason": reason,
        "since": now,
        "until": now + seconds,
        "modules": {m: module_identity(sysfs, m) for m in modules},
    }
    path = sysfs.path(PAUSE_FILE)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, json.dumps(record).encode())  # 0644: status readers may read it
    return PauseObserved(by, reason, now, now + seconds, tuple(modules))


def clear_pause(sysfs: Sysfs) -> bool:
    """End the pause now; False when there was none."""
    try:
        os.unlink(sysfs.path(PAUSE_FILE))
    except FileNotFoundError:
        return False
    return True


def read_pause(sysfs: Sysfs, now: float) -> PauseObserved | None:
    """The pause in force at ``now``, or None (none, ended, or unreadable).

    An unreadable or malformed file is no pause: standing back is a courtesy to an
    operator's stop, and a broken file must not keep a node from being restored.
    """
    text = sysfs.read(PAUSE_FILE)
    if not text:
        return None
    try:
        raw = json.loads(text)
        by, reason = str(raw["by"]), str(raw["reason"])
        since, until = float(raw["since"]), float(raw["until"])
        modules = {str(k): (None if v is None else int(v)) for k, v in raw["modules"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not since - 60.0 <= now < until or until - since > MAX_PAUSE:
        return None
    for module, identity in modules.items():
        current = module_identity(sysfs, module)
        if current is not None and current != identity:
            return None  # loaded again since the pause began: the stack is back
    return PauseObserved(by, reason, since, until, tuple(modules))
