"""Config files -> ``Desired``, with every error named by file and key path.

Layout: ``DIR/rdmad.toml`` plus ``DIR/rdmad.d/*.toml`` applied in name order.

Merge rules (documented in etc/rdmad/rdmad.toml too):

* ``[daemon]`` and ``[peermem]``: key by key, a later file's key wins.
* ``[[rxe]]``: keyed by ``name``; ``[[sriov]]``: keyed by ``pf`` (the same
  reference, e.g. ``pf = { pci = "0000:3b:00.0" }``). A later file that names
  the same object overrides the keys it sets; keys it does not set stay.
  Nested tables (``netdev``, ``pf``) are replaced whole.
* ``[[sriov.vf]]`` entries are keyed by ``index`` within their PF, same rule.

Errors are collected, never stopping at the first: a TOML syntax error in one
file does not hide schema errors in another.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rdmad.model import Desired, NetdevRef

DEFAULT_DIR = Path("/etc/rdmad")
MAIN_FILE = "rdmad.toml"
DROPIN_DIR = "rdmad.d"

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigError:
    file: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.message}"


class ConfigInvalid(Exception):
    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass(frozen=True)
class LoadedConfig:
    desired: Desired
    files: tuple[str, ...]


def config_files(location: Path) -> list[Path]:
    """The files that make up the config at ``location`` (a dir or one file)."""
    if location.is_file():
        return [location]
    files = []
    main = location / MAIN_FILE
    if main.is_file():
        files.append(main)
    dropins = location / DROPIN_DIR
    if dropins.is_dir():
        files.extend(sorted(p for p in dropins.glob("*.toml") if p.is_file()))
    return files


def load(location: Path = DEFAULT_DIR) -> LoadedConfig:
    """Read, merge and validate; raise ConfigInvalid with all errors."""
    if not location.exists():
        raise ConfigInvalid([ConfigError(str(location), "", "no such file or directory")])
    files = config_files(location)
    docs: list[tuple[str, dict[str, Any]]] = []
    errors: list[ConfigError] = []
    for path in files:
        try:
            with path.open("rb") as fh:
                docs.append((str(path), tomllib.load(fh)))
        except tomllib.TOMLDecodeError as exc:
            errors.append(ConfigError(str(path), "", f"not valid TOML: {exc}"))
        except OSError as exc:
            errors.append(ConfigError(str(path), "", f"cannot read: {exc.strerror}"))
    desired, more = parse(docs)
    errors.extend(more)
    if errors or desired is None:
        raise ConfigInvalid(errors)
    return LoadedConfig(desired, tuple(str(p) for p in files))


def parse(docs: Iterable[tuple[str, dict[str, Any]]]) -> tuple[Desired | None, list[ConfigError]]:
    """Merge parsed TOML documents (in order) and validate the result."""
    merger = _Merger()
    for file, doc in docs:
        merger.add(file, doc)
    errors: list[ConfigError] = []
    try:
        desired = Desired.model_validate(merger.merged)
    except ValidationError as exc:
        for err in exc.errors():
            file, path = merger.origin(tuple(err["loc"]))
            errors.append(ConfigError(file, path, _message(err)))
        return None, errors
    errors.extend(_cross_checks(desired, merger))
    return (None if errors else desired), errors


def _message(err: Any) -> str:
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key is missing"
    return msg


def _cross_checks(desired: Desired, merger: _Merger) -> list[ConfigError]:
    """Rules that span objects: one rxe per netdev, one declaration per PF reference."""
    errors = []
    seen: dict[NetdevRef, int] = {}
    for i, rxe in enumerate(desired.rxe):
        if rxe.netdev in seen:
            other = desired.rxe[seen[rxe.netdev]].name
            file, path = merger.origin(("rxe", i, "netdev"))
            errors.append(
                ConfigError(
                    file,
                    path,
                    f"{rxe.netdev.describe()} already carries rxe {other!r}; "
                    "the kernel allows one rxe link per netdev",
                )
            )
        else:
            seen[rxe.netdev] = i
    return errors


def _render(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _Merger:
    """Merges documents by object identity and remembers where each key came from."""

    def __init__(self) -> None:
        self.merged: dict[str, Any] = {}
        # merged location -> (file, location in that file)
        self._origin: dict[Loc, tuple[str, Loc]] = {}
        self._last_file = ""

    def origin(self, loc: Loc) -> tuple[str, str]:
        for cut in range(len(loc), 0, -1):
            hit = self._origin.get(loc[:cut])
            if hit is not None:
                file, file_loc = hit
                return file, _render(file_loc + loc[cut:])
        return self._last_file, _render(loc)

    def _set(self, loc: Loc, file: str, file_loc: Loc) -> None:
        self._origin[loc] = (file, file_loc)

    def add(self, file: str, doc: dict[str, Any]) -> None:
        self._last_file = file
        for key, value in doc.items():
            if key in ("rxe", "sriov") and isinstance(value, list):
                for i, item in enumerate(value):
                    self._add_object(file, key, i, item)
            elif isinstance(value, dict) and isinstance(self.merged.get(key, {}), dict):
                table = self.merged.setdefault(key, {})
                self._set((key,), file, (key,))
                for sub, subval in value.items():
                    table[sub] = subval
                    self._set((key, sub), file, (key, sub))
            else:
                # Wrong shape or unknown key: keep it so validation reports it here.
                self.merged[key] = value
                self._set((key,), file, (key,))

    def _add_object(self, file: str, section: str, i: int, item: Any) -> None:
        objects: list[Any] = self.merged.setdefault(section, [])
        identity = _identity(section, item)
        index = next(
            (n for n, o in enumerate(objects) if identity and _identity(section, o) == identity),
            None,
        )
        if index is None or not isinstance(item, dict):
            objects.append(dict(item) if isinstance(item, dict) else item)
            index = len(objects) - 1
            self._set((section, index), file, (section, i))
            if isinstance(item, dict):
                for key in item:
                    self._set((section, index, key), file, (section, i, key))
            if isinstance(item, dict) and isinstance(item.get("vf"), list):
                objects[index]["vf"] = []
                for j, vf in enumerate(item["vf"]):
                    self._add_vf(file, index, i, j, vf)
            return
        target = objects[index]
        for key, value in item.items():
            if key == "vf" and section == "sriov" and isinstance(value, list):
                target.setdefault("vf", [])
                self._set((section, index, "vf"), file, (section, i, "vf"))
                for j, vf in enumerate(value):
                    self._add_vf(file, index, i, j, vf)
            else:
                target[key] = value
                self._set((section, index, key), file, (section, i, key))

    def _add_vf(self, file: str, pf_index: int, file_pf: int, j: int, vf: Any) -> None:
        vfs: list[Any] = self.merged["sriov"][pf_index].setdefault("vf", [])
        if not isinstance(vfs, list):
            return
        match = None
        if isinstance(vf, dict) and isinstance(vf.get("index"), int):
            match = next(
                (
                    n
                    for n, o in enumerate(vfs)
                    if isinstance(o, dict) and o.get("index") == vf["index"]
                ),
                None,
            )
        if match is None or not isinstance(vf, dict):
            vfs.append(dict(vf) if isinstance(vf, dict) else vf)
            match = len(vfs) - 1
            self._set(("sriov", pf_index, "vf", match), file, ("sriov", file_pf, "vf", j))
        target = vfs[match]
        if isinstance(vf, dict):
            for key, value in vf.items():
                target[key] = value
                self._set(
                    ("sriov", pf_index, "vf", match, key), file, ("sriov", file_pf, "vf", j, key)
                )


def _identity(section: str, item: Any) -> tuple[str, ...] | None:
    """The key a later file uses to address the same object; None if unusable."""
    if not isinstance(item, dict):
        return None
    if section == "rxe":
        name = item.get("name")
        return ("name", name) if isinstance(name, str) else None
    pf = item.get("pf")
    if isinstance(pf, dict) and len(pf) == 1:
        ((kind, value),) = pf.items()
        if isinstance(value, str):
            value = value.strip()
            if kind in ("pci", "mac"):
                value = value.lower()
            if kind == "pci" and len(value) == 7:
                value = "0000:" + value
            return (str(kind), value)
    return None
