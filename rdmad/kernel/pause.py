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
  too. A module not loaded when the pause began counts as back once it is loaded;
* when whoever asked ends it: the guard after an unload that failed (the module is
  still loaded), a stack stop that left the RDMA core loaded, ``rdmad-ctl resume``.
  The file is then kept with ``ended`` and ``ended_why``, so the daemon's history
  says why the pause ended even when no pass ran while it was in force.

Written by the guard (a short-lived root process, from modprobe) and by the daemon's
API, read by every observation: a small JSON file written atomically, never locked.
Standard library only: the guard imports this inside `modprobe -r`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

from rdmad.fileio import write_atomic
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.shared_observed import PauseObserved

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
    """Remove the pause file; False when there was none. (``end_pause`` keeps why.)"""
    try:
        os.unlink(sysfs.path(PAUSE_FILE))
    except FileNotFoundError:
        return False
    return True


def end_pause(
    sysfs: Sysfs,
    *,
    why: str,
    now: float,
    only: PauseObserved | None = None,
) -> PauseObserved | None:
    """End the pause in force now, saying why; the pause that was ended, or None.

    ``only``: end it only if it is still that pause (same ``by`` and ``since``): the
    guard ends its own pause after a failed unload, never one written meanwhile by
    someone else. Read, check and replace are not atomic against a second writer; the
    window is a few microseconds between two root processes, and losing that race
    costs at most a pause that runs to its end. Raises OSError when it cannot write.
    """
    record = _record(sysfs)
    if record is None:
        return None
    pause = _pause_of(record)
    if pause is None or "ended" in record:
        return None
    if only is not None and (pause.by, pause.since) != (only.by, only.since):
        return None
    record["ended"], record["ended_why"] = now, why
    write_atomic(sysfs.path(PAUSE_FILE), json.dumps(record).encode())
    return pause


def read_pause(sysfs: Sysfs, now: float) -> PauseObserved | None:
    """The pause in force at ``now``, or None (none, ended, or unreadable).

    An unreadable or malformed file is no pause: standing back is a courtesy to an
    operator's stop, and a broken file must not keep a node from being restored.
    """
    return in_force(read_pause_record(sysfs, now))


def in_force(record: PauseObserved | None) -> PauseObserved | None:
    """Of the last pause written (``read_pause_record``), the pause in force: None when
    there is none or it is over."""
    return record if record is not None and record.ended_why is None else None


def read_pause_record(sysfs: Sysfs, now: float) -> PauseObserved | None:
    """The last pause written, in force or over (``ended_at``/``ended_why`` say when and
    why it ended), for the daemon's history; None when there is none or it is unreadable."""
    record = _record(sysfs)
    pause = _pause_of(record) if record is not None else None
    if record is None or pause is None:
        return None
    if not pause.since - 60.0 <= now or pause.until - pause.since > MAX_PAUSE:
        return None  # from the future, or longer than any pause: a stepped clock
    ended = record.get("ended")
    if isinstance(ended, int | float) and not isinstance(ended, bool):
        return replace(pause, ended_at=float(ended), ended_why=str(record.get("ended_why", "")))
    if now >= pause.until:
        return replace(pause, ended_at=pause.until, ended_why="it ran out")
    for module, identity in record["modules"].items():
        current = module_identity(sysfs, module)
        if current is not None and current != identity:
            # Loaded again since the pause began: the stack is back.
            return replace(pause, ended_at=now, ended_why=f"{module} is loaded again")
    return pause


def pause_identity(sysfs: Sysfs, module: str) -> int | None:
    """The identity ``module`` had when the pause in the file began (None: not loaded
    then, or no such pause)."""
    record = _record(sysfs)
    if record is None or _pause_of(record) is None:
        return None
    identity: int | None = record["modules"].get(module)
    return identity


def _record(sysfs: Sysfs) -> dict[str, Any] | None:
    text = sysfs.read(PAUSE_FILE)
    if not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def _pause_of(raw: dict[str, Any]) -> PauseObserved | None:
    try:
        by, reason = str(raw["by"]), str(raw["reason"])
        since, until = float(raw["since"]), float(raw["until"])
        modules = {str(k): (None if v is None else int(v)) for k, v in raw["modules"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None
    if not (math.isfinite(since) and math.isfinite(until)):
        return None
    raw["modules"] = modules
    return PauseObserved(by, reason, since, until, tuple(modules))
