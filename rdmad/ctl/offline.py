"""What rdmad-ctl can tell when the daemon is down: the state file the daemon left.

The file's format is rdmad/state.py's (``version``, ``boot_id``, ``started_at``,
``managed_rxe``, ``applied``, ``last_errors``, ``history``). It is parsed here with
``json`` alone: importing rdmad.state would pull in the daemon's stack (msgspec,
structlog) and cost rdmad-ctl its fast start. Every problem becomes words, never
an exception: this runs exactly when something is already wrong.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any

DEFAULT_STATE_DIR = "/var/lib/rdmad"
STATE_FILE = "state.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
KNOWN_VERSION = 1


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


def read_boot_id(path: str = BOOT_ID) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def load(path: str, boot_id: str) -> dict[str, Any]:
    """The saved state as a JSON-ready document (what ``--json`` prints offline).

    ``{"file", "readable", "problem", "written_at", "this_boot", "started_at",
    "managed_rxe", "applied", "last_errors", "history"}``; ``problem`` says why
    nothing (or not everything) could be read.
    """
    doc: dict[str, Any] = {
        "file": path,
        "readable": False,
        "problem": None,
        "written_at": None,
        "boot_id": None,
        "this_boot": None,
        "started_at": None,
        "managed_rxe": [],
        "applied": {},
        "last_errors": {},
        "history": [],
    }
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
            doc["written_at"] = os.fstat(fh.fileno()).st_mtime
    except FileNotFoundError:
        doc["problem"] = f"no state file at {path} (rdmad has not run here, or --state-dir)"
        return doc
    except PermissionError:
        doc["problem"] = f"{path} is not readable by you (permission denied): try as root"
        return doc
    except OSError as exc:
        doc["problem"] = f"{path} cannot be read: {exc.strerror or exc}"
        return doc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        doc["problem"] = f"{path} is corrupt (not JSON: {exc}); rdmad rebuilds it on start"
        return doc
    if not isinstance(data, dict):
        doc["problem"] = f"{path} is corrupt (not a JSON object); rdmad rebuilds it on start"
        return doc
    if data.get("version") != KNOWN_VERSION:
        doc["problem"] = (
            f"{path} has state format {data.get('version')!r}; this rdmad-ctl reads "
            f"{KNOWN_VERSION}: showing what it can"
        )
    doc["readable"] = True
    saved_boot = data.get("boot_id")
    doc["boot_id"] = saved_boot if isinstance(saved_boot, str) else None
    if doc["boot_id"] and boot_id:
        doc["this_boot"] = doc["boot_id"] == boot_id
    doc["started_at"] = _number(data.get("started_at"))
    managed = data.get("managed_rxe")
    doc["managed_rxe"] = (
        [m for m in managed if isinstance(m, str)] if isinstance(managed, list) else []
    )
    doc["applied"] = _objects(data.get("applied"))
    doc["last_errors"] = _objects(data.get("last_errors"))
    history = data.get("history")
    doc["history"] = (
        [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []
    )
    return doc


def _objects(value: object) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, dict)}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
