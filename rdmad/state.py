"""What rdmad remembers across restarts, in ``STATE_DIR/state.json``.

Which rxe links it created (so it may delete them when undeclared), the last
change per object (what, when, why), last errors, recent history and the
boot_id of the run that wrote it. The file is never needed to be correct: a
missing or corrupt file is reported and rebuilt (rdmad then owns nothing and
loses only history), never fatal.

Writes are atomic (``fileio.write_atomic``): a temp file in the same directory, fsync,
rename over the old file, fsync the directory; a crash leaves the old or the new file,
not half.

``rxe-claims.json`` beside it holds the rxe links rdmad owns while one is being
created: one JSON line appended (not fsynced) before each create, read as part of the
state (its last whole line), removed by the next save of the state, which has them.
Encoding the whole state (history included) costs tens of milliseconds under
emulation; a claim is on the event path: one write(2) on a file kept open (a temp file
and a rename cost 3-14 ms there).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import msgspec

from rdmad.fileio import write_atomic
from rdmad.model import DaemonSpec
from rdmad.status import HistoryEntry

FILENAME = "state.json"
CLAIMS = "rxe-claims.json"
_CLAIMS_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
VERSION = 1
HISTORY_KEPT = 200
DEFAULT_DIR = DaemonSpec().state_dir


class State(msgspec.Struct):
    boot_id: str = ""
    managed_rxe: set[str] = msgspec.field(default_factory=set)
    # object -> {"what", "at", "reason", "cause"} of the last change applied to it
    applied: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # object -> {"error", "at", "failures", "errno"} of its last failure
    last_errors: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    history: list[HistoryEntry] = msgspec.field(default_factory=list)
    started_at: float = 0.0
    # Entries of the file read that were odd and left out, in words (never saved).
    dropped: list[str] = msgspec.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "boot_id": self.boot_id,
            "started_at": self.started_at,
            "managed_rxe": sorted(self.managed_rxe),
            "applied": self.applied,
            "last_errors": self.last_errors,
            "history": [h.to_json() for h in self.history[-HISTORY_KEPT:]],
        }

    @classmethod
    def from_json(cls, data: Any) -> State:
        """The state a document holds. Raises ValueError when it is no state at all (not
        an object, another version); an odd entry inside is left out and named in
        ``dropped``: the agent uses every entry it keeps without looking again."""
        if not isinstance(data, dict):
            raise ValueError("top level is not an object")
        if data.get("version") != VERSION:
            raise ValueError(f"unknown version {data.get('version')!r}")
        entries = _Entries()
        boot_id = entries.text(data, "boot_id", "boot_id", default="")
        started_at = entries.number(data, "started_at", "started_at", default=0.0)
        return cls(
            boot_id=boot_id or "",
            managed_rxe=set(entries.names(data.get("managed_rxe", []), "managed_rxe")),
            applied=entries.objects(data.get("applied", {}), "applied", _APPLIED),
            last_errors=entries.objects(data.get("last_errors", {}), "last_errors", _ERRORS),
            history=entries.history(data.get("history", [])),
            started_at=started_at or 0.0,
            dropped=entries.dropped,
        )


# The fields of an ``applied`` / ``last_errors`` entry: name -> (kind, required, default).
Field = tuple[str, bool, Any]
_APPLIED: dict[str, Field] = {
    "what": ("text", True, ""),
    "at": ("number", True, 0.0),
    "reason": ("text", False, ""),
    "cause": ("text", False, ""),
}
_ERRORS: dict[str, Field] = {
    "error": ("text", True, ""),
    "at": ("number", True, 0.0),
    "failures": ("count", False, 1),
    "errno": ("errno", False, None),
}
_HISTORY: dict[str, Field] = {
    "at": ("number", True, 0.0),
    "event": ("text", True, ""),
    "obj": ("text", False, ""),
    "what": ("text", False, ""),
    "reason": ("text", False, ""),
    "cause": ("text", False, ""),
    "error": ("text-or-null", False, None),
    "errno": ("errno", False, None),
    "kind": ("text", False, ""),
}
_NOT_A = {
    "text": "not a string",
    "text-or-null": "not a string",
    "number": "not a finite number",
    "count": "not a count",
    "errno": "not an errno",
}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a double
        return None
    return number if math.isfinite(number) else None


def _check(kind: str, value: Any) -> tuple[bool, Any]:
    """(valid, the value as the agent keeps it) for one field of an entry."""
    if kind == "number":
        number = _finite(value)
        return number is not None, number
    if kind == "text":
        return isinstance(value, str), value
    if kind == "text-or-null":
        return value is None or isinstance(value, str), value
    if kind == "count":
        valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
        return valid, value
    # errno: a small positive integer or nothing
    valid = value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 0 < value < 4096
    )
    return valid, value


def _shown(value: Any) -> str:
    """A value as the warning shows it: JSON, cut short."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 32 else text[:31] + "…"


class _Entries:
    """Reads a state document's entries, keeping the good ones, naming each odd one."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def odd(self, where: str, why: str) -> None:
        self.dropped.append(f"{where}: {why}")

    def text(self, data: dict[str, Any], key: str, where: str, default: str) -> str | None:
        value = data.get(key, default)
        if isinstance(value, str):
            return value
        self.odd(where, f"not a string: {_shown(value)}")
        return None

    def number(self, data: dict[str, Any], key: str, where: str, default: float) -> float | None:
        value = data.get(key, default)
        number = _finite(value)
        if number is None:
            self.odd(where, f"not a number: {_shown(value)}")
        return number

    def names(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list):
            self.odd(where, f"not a list: {_shown(value)}")
            return []
        kept = []
        for i, name in enumerate(value):
            if isinstance(name, str) and name:
                kept.append(name)
            else:
                self.odd(f"{where}[{i}]", f"not a name: {_shown(name)}")
        return kept

    def entry(self, raw: Any, where: str, fields: dict[str, Field]) -> dict[str, Any] | None:
        if not isinstance(raw, dict):
            self.odd(where, f"not an object: {_shown(raw)}")
            return None
        entry: dict[str, Any] = {}
        for name, (kind, required, default) in fields.items():
            if name not in raw:
                if required:
                    self.odd(f"{where}.{name}", "missing")
                    return None
                entry[name] = default
                continue
            valid, value = _check(kind, raw[name])
            if not valid:
                self.odd(f"{where}.{name}", f"{_NOT_A[kind]}: {_shown(raw[name])}")
                return None
            entry[name] = value
        return entry

    def objects(
        self, value: Any, where: str, fields: dict[str, Field]
    ) -> dict[str, dict[str, Any]]:
        if not isinstance(value, dict):
            self.odd(where, f"not an object: {_shown(value)}")
            return {}
        kept = {}
        for obj, raw in value.items():
            entry = self.entry(raw, f"{where}[{json.dumps(obj)}]", fields)
            if entry is not None:
                kept[obj] = entry
        return kept

    def history(self, value: Any) -> list[HistoryEntry]:
        if not isinstance(value, list):
            self.odd("history", f"not a list: {_shown(value)}")
            return []
        kept = []
        for i, raw in enumerate(value):
            entry = self.entry(raw, f"history[{i}]", _HISTORY)
            if entry is not None:
                kept.append(HistoryEntry(**entry))
        return kept


def read_state(path: str | os.PathLike[str]) -> tuple[State | None, str | None]:
    """Read a state file and change nothing: (state, None), (None, None) when there is no
    file, (None, problem in words) when it cannot be read or is corrupt."""
    state, problem, _ = _read(Path(path))
    return state, problem


def _read(path: Path) -> tuple[State | None, str | None, bool]:
    """(state, problem, corrupt): corrupt means the file exists and holds no valid state.

    Claims of the same boot, left by a run that stopped before it saved again, are added.
    """
    state, problem, corrupt = _read_state_file(path)
    boot_id, claimed = _read_claims(path.with_name(CLAIMS))
    if not claimed or problem is not None:
        return state, problem, corrupt
    if state is None:
        return State(boot_id=boot_id, managed_rxe=set(claimed)), None, False
    if state.boot_id == boot_id:
        state.managed_rxe |= claimed
    return state, None, False


def _read_state_file(path: Path) -> tuple[State | None, str | None, bool]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None, False
    except OSError as exc:
        return None, f"state file {path} cannot be read ({exc.strerror})", False
    try:
        return State.from_json(json.loads(raw)), None, False
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"state file {path} is corrupt ({exc})", True


def _read_claims(path: Path) -> tuple[str, set[str]]:
    """(boot_id, rxe names) of a claims file's last whole line (each line holds every
    claimed name); nothing when absent or unreadable."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return "", set()
    for line in reversed(lines):
        try:
            data = json.loads(line)
            names = data["rxe"]
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return str(data["boot_id"]), set(names)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (power loss): the one before it
    return "", set()


class StateStore:
    """Load and save ``State``; every problem is returned as words, never raised."""

    def __init__(self, directory: str | os.PathLike[str], filename: str = FILENAME) -> None:
        self.directory = Path(directory)
        self.path = self.directory / filename
        self._claims_fd: int | None = None  # rxe-claims.json, open for appending

    def load(self) -> tuple[State | None, str | None]:
        """(state, None); (None, None) when there is no file yet; (None, problem) when corrupt.

        A corrupt file is moved aside (the daemon rebuilds it); ``read_state`` only reads.
        """
        state, problem, corrupt = _read(self.path)
        if problem is None:
            return state, None
        if not corrupt:
            return None, f"{problem}; starting afresh"
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            kept = f"kept as {aside}"
        except OSError as move_exc:
            kept = f"could not move it aside: {move_exc.strerror}"
        return None, f"{problem}; {kept}; rebuilding it"

    def save(self, state: State) -> str | None:
        """Write atomically; the error in words if that failed (the daemon carries on)."""
        data = json.dumps(state.to_json(), indent=1, sort_keys=True, default=str).encode()
        problem = self._replace(self.path, data)
        if problem is None:
            self._empty_claims()
        return problem

    def _empty_claims(self) -> None:
        """The state now holds every claim: the claims file is emptied and kept open for
        the next one. Created again on the event path, right before an rxe add, it cost
        2-20 ms under emulation (bench/RESULTS.md); emptied here, it costs the pass that
        saved, after it answered."""
        path = self.path.with_name(CLAIMS)
        try:
            if self._claims_fd is None:
                self._claims_fd = os.open(path, _CLAIMS_FLAGS, 0o644)
            os.ftruncate(self._claims_fd, 0)
        except OSError:
            self.close()
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def claim_rxe(self, boot_id: str, names: set[str]) -> str | None:
        """Before creating an rxe link: the links rdmad owns, the new one included.

        One line appended in one write(2) (a killed daemon leaves it whole or absent),
        not fsynced: only a process crash needs it. A power loss takes the rxe links
        with it, and a claim counts only in the boot that made it.
        """
        line = json.dumps({"boot_id": boot_id, "rxe": sorted(names)}).encode() + b"\n"
        path = self.path.with_name(CLAIMS)
        try:
            if self._claims_fd is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._claims_fd = os.open(path, _CLAIMS_FLAGS, 0o644)
            written = os.write(self._claims_fd, line)
        except OSError as exc:
            self.close()
            return f"state file {path} not written: {exc.strerror or exc}"
        if written != len(line):  # a full disk mid-line: the reader skips a torn line
            return f"state file {path} not written: {written} of {len(line)} bytes"
        return None

    def close(self) -> None:
        """Close the claims file (save() empties it; the next claim opens it again)."""
        if self._claims_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._claims_fd)
            self._claims_fd = None

    def _replace(self, path: Path, data: bytes) -> str | None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError as exc:
            return f"state file {path} not written: {exc.strerror or exc}"
        return None


def start_kind(previous: State | None, boot_id: str, problem: str | None) -> str:
    """boot / restart / first-start: how this run relates to the one that wrote the state."""
    if previous is None:
        return "unknown (state rebuilt)" if problem else "first-start"
    if not boot_id or not previous.boot_id:
        return "unknown (no boot_id)"
    return "restart" if previous.boot_id == boot_id else "boot"


def resolve_dir(configured: str) -> str:
    """Where the state lives: systemd's StateDirectory= unless [daemon] state_dir was changed."""
    env = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if configured == DEFAULT_DIR and env:
        return env
    return configured


def owned_rxe(state: State | None, boot_id: str) -> frozenset[str]:
    """The rxe links a run in boot ``boot_id`` may treat as rdmad's, given the saved state.

    Only within the boot that created them: after a reboot none survives and their
    names may be reused by links someone else made. The agent's start-up applies the
    same rule (restart vs boot); ``rdmad plan`` uses it to print what the daemon would do.
    """
    if state is None or not boot_id or state.boot_id != boot_id:
        return frozenset()
    return frozenset(state.managed_rxe)


def describe_ownership(path: str | os.PathLike[str], boot_id: str) -> tuple[frozenset[str], str]:
    """(rxe links rdmad owns, one line saying which state was used and why) for ``rdmad plan``."""
    state, problem = read_state(path)
    if problem is not None:
        return frozenset(), f"state: {problem}: rdmad owns no rxe link"
    if state is None:
        return frozenset(), f"state: none at {path}: rdmad owns no rxe link"
    owned = owned_rxe(state, boot_id)
    if not boot_id or not state.boot_id:
        why = "the boot it was written in is unknown"
        return owned, f"state: {path} ({why}): rdmad owns no rxe link"
    if state.boot_id != boot_id:
        return owned, (
            f"state: {path} is from an earlier boot: rdmad owns no rxe link "
            "(links are its own only within the boot that created them)"
        )
    names = ", ".join(sorted(owned)) or "none"
    return owned, f"state: {path}, written this boot: rdmad-created rxe links: {names}"
