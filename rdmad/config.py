"""Config files -> ``Desired``, with every error named by file and key path.

Layout: ``DIR/rdmad.toml`` plus ``DIR/rdmad.d/*.toml`` applied in name order
(names starting with a dot are not config files).

Merge rules (documented in etc/rdmad/rdmad.toml too):

* ``[daemon]`` and ``[peermem]``: key by key, a later file's key wins.
* ``[[rxe]]``: keyed by ``name``; ``[[sriov]]``: keyed by ``pf`` (the same
  reference, e.g. ``pf = { pci = "0000:3b:00.0" }``). A later file that names
  the same object overrides the keys it sets; keys it does not set stay.
  Nested tables (``netdev``, ``pf``) are replaced whole.
* ``[[sriov.vf]]`` entries are keyed by ``index`` within their PF, same rule;
  a VF's ``in_use_drift`` left unset follows its PF's.

Errors are collected, never stopping at the first: a TOML syntax error in one
file does not hide schema errors in another. Anything on disk that cannot be
read as a config (not UTF-8, over 1 MiB, a directory, FIFO, symlink loop, a
file gone between listing and reading) is such an error, never an exception:
the daemon keeps running on its last good config. So is a file that someone
other than root could change (group- or world-writable, or, when rdmad runs as
root, not owned by root): its content would be root's orders from a non-root user.
"""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rdmad.model import ApiSpec, DaemonSpec, Desired, MetricsSpec, NetdevRef
from rdmad.model.validation import Loc, SpecError, render, validate

DEFAULT_DIR = Path("/etc/rdmad")
MAIN_FILE = "rdmad.toml"
DROPIN_DIR = "rdmad.d"
# A declaration of thousands of VFs is well under 1 MiB; anything larger is a mistake
# (a log or image copied into rdmad.d) and reading it whole would cost the daemon memory.
MAX_FILE_BYTES = 1024 * 1024

_SpecT = TypeVar("_SpecT", DaemonSpec, MetricsSpec, ApiSpec)


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
    """The files that make up the config at ``location`` (a dir or one file).

    Problems finding them are left to ``load()``, which reports them; this only lists.
    """
    files, _ = _discover(location)
    return files


def _discover(location: Path) -> tuple[list[Path], list[ConfigError]]:
    """List the config files; every entry that cannot be a config file is an error.

    A drop-in named ``*.toml`` that is a directory, a dangling symlink or a symlink
    loop is an error rather than silently skipped: its author meant it to count.
    Hidden names (``.#x.toml`` editor locks, ``.x.toml.tmp``) are not config files.
    """
    errors: list[ConfigError] = []
    try:
        mode = location.stat().st_mode
    except OSError as exc:
        return [], [ConfigError(_display(location), "", _os_problem(exc))]
    if not stat.S_ISDIR(mode):
        return [location], []
    files = [location / MAIN_FILE]
    if not os.path.lexists(files[0]):
        files = []  # the main file is optional; drop-ins alone are a config
    dropins = location / DROPIN_DIR
    if os.path.lexists(dropins):
        try:
            names = sorted(os.listdir(dropins))
        except OSError as exc:
            errors.append(ConfigError(_display(dropins), "", _os_problem(exc)))
            names = []
        files.extend(dropins / n for n in names if n.endswith(".toml") and not n.startswith("."))
    return files, errors


def read_document(path: Path) -> tuple[dict[str, Any] | None, ConfigError | None]:
    """One file as TOML, or the reason it cannot be read, naming the file.

    Opened non-blocking and checked to be a regular file before reading, so a FIFO
    or device named ``*.toml`` cannot hang the daemon; read with a size limit so a
    runaway file cannot exhaust its memory.
    """
    name = _display(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, ConfigError(name, "", _os_problem(exc))
    try:
        st = os.fstat(fd)
        kind = _file_kind(st.st_mode)
        if kind != "regular file":
            return None, ConfigError(name, "", f"is a {kind}, not a config file")
        unsafe = unsafe_ownership(st, os.geteuid())
        if unsafe is not None:
            return None, ConfigError(name, "", unsafe)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return None, ConfigError(name, "", _os_problem(exc))
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        limit = f"{MAX_FILE_BYTES // 1024 // 1024} MiB"
        return None, ConfigError(name, "", f"larger than the {limit} limit for a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        return None, ConfigError(
            name,
            "",
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column}; "
            "TOML files must be UTF-8",
        )
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as exc:
        return None, ConfigError(name, "", f"not valid TOML: {exc}")
    except RecursionError:
        return None, ConfigError(name, "", "not valid TOML: arrays or tables nested too deeply")


def unsafe_ownership(st: os.stat_result, reader_uid: int) -> str | None:
    """Why a config file is refused for who may change it, or None when it is safe.

    rdmad runs as root and turns its config into kernel writes, so whoever can change
    a config file can change the node: a file that others can write, or (when the
    reader is root) one that a user other than root owns, would hand root's powers to
    that user. Checked on the opened file (a symlink counts as its target).
    """
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = (
            "group- and world-"
            if mode & stat.S_IWGRP and mode & stat.S_IWOTH
            else ("group-" if mode & stat.S_IWGRP else "world-")
        )
        return (
            f"refused: the file is {who}writable (mode {mode:04o}); only its owner may "
            "write a config file (chmod go-w)"
        )
    if reader_uid == 0 and st.st_uid != 0:
        return (
            f"refused: the file is owned by uid {st.st_uid}, not root; a config that "
            "rdmad runs as root must belong to root (chown root)"
        )
    return None


def _read_all(
    location: Path,
) -> tuple[list[Path], list[tuple[str, dict[str, Any]]], list[ConfigError]]:
    """The config files at ``location``, the documents that read, and what did not."""
    files, errors = _discover(location)
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        doc, problem = read_document(path)
        if problem is not None:
            errors.append(problem)
        elif doc is not None:
            docs.append((_display(path), doc))
    return files, docs, errors


def load(location: Path = DEFAULT_DIR) -> LoadedConfig:
    """Read, merge and validate; raise ConfigInvalid with all errors.

    Raises nothing else for anything found on disk: a file that cannot be read,
    vanishes after listing, is not UTF-8 or is too big is a ConfigError like a
    bad value, so the daemon keeps its last good config instead of exiting.
    """
    files, docs, errors = _read_all(location)
    desired, more = parse(docs)
    errors.extend(more)
    if errors or desired is None:
        raise ConfigInvalid(errors)
    return LoadedConfig(desired, tuple(_display(p) for p in files))


def daemon_settings(location: Path = DEFAULT_DIR) -> DaemonSpec:
    """The ``[daemon]`` settings to start with, even when the config as a whole is invalid.

    Logging and the state directory are chosen before the agent loads the config;
    a broken drop-in must not send the state file to the default directory or drop
    the log level the admin set. See ``_section_settings``.
    """
    return _section_settings(location, "daemon", DaemonSpec)


def metrics_settings(location: Path = DEFAULT_DIR) -> MetricsSpec:
    """The ``[metrics]`` settings (textfile directory, TCP listener) to start with.

    Like ``daemon_settings``: an invalid config elsewhere must not switch metrics off.
    """
    return _section_settings(location, "metrics", MetricsSpec)


def api_settings(location: Path = DEFAULT_DIR) -> ApiSpec:
    """The ``[api]`` settings to start the API with, read like ``daemon_settings``: an
    invalid config elsewhere must not take the API (the way to see why) away."""
    return _section_settings(location, "api", ApiSpec)


def _section_settings(location: Path, section: str, spec: type[_SpecT]) -> _SpecT:
    """One top-level table's settings, even when the config as a whole is invalid.

    Every file that reads, merged as usual, and each key of ``[section]`` that is
    valid on its own; the rest take their defaults. The errors are the agent's to
    report (it loads the config itself), so none are returned here.
    """
    merger = _merge_readable(location)
    table = merger.merged.get(section)
    if not isinstance(table, dict):
        return spec()
    good = {}
    for key, value in table.items():
        try:
            validate(spec, {key: value})
        except SpecError:
            continue
        good[key] = value
    return validate(spec, good)


def _merge_readable(location: Path) -> _Merger:
    files, _ = _discover(location)
    merger = _Merger()
    for path in files:
        doc, _problem = read_document(path)
        if doc is not None:
            merger.add(_display(path), doc)
    return merger


@dataclass(frozen=True)
class ValueOrigin:
    """One value of the merged config and where it came from."""

    key: str  # its path in the merged config, e.g. "sriov[0].numvfs"
    value: Any
    file: str
    file_key: str  # its path in that file (drop-ins number their own [[sriov]] entries)


@dataclass(frozen=True)
class Effective:
    """The config as merged from its files (valid or not), for showing, never for running."""

    merged: dict[str, Any]
    values: tuple[ValueOrigin, ...]
    files: tuple[str, ...]
    errors: tuple[ConfigError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def effective(location: Path = DEFAULT_DIR) -> Effective:
    """The merged config at ``location`` with the file and key each value came from,
    and every error ``load()`` would report. Reads only; changes nothing."""
    files, docs, errors = _read_all(location)
    merger = _Merger()
    for file, doc in docs:
        merger.add(file, doc)
    _desired, more = parse(docs)
    errors.extend(more)
    values = []
    for loc, value in _leaves(merger.merged, ()):
        file, file_key = merger.origin(loc)
        values.append(ValueOrigin(render(loc), value, file, file_key))
    return Effective(merger.merged, tuple(values), tuple(_display(p) for p in files), tuple(errors))


def _leaves(value: Any, loc: Loc) -> Iterable[tuple[Loc, Any]]:
    """Every value that is not a table or an array of tables, with its location."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaves(sub, (*loc, key))
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for i, sub in enumerate(value):
            yield from _leaves(sub, (*loc, i))
    else:
        yield loc, value


def _display(path: Path) -> str:
    """A file name safe to print and log: undecodable bytes shown as escapes."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _os_problem(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "cannot read: too many levels of symbolic links (a symlink loop?)"
    if exc.errno == errno.ENOENT:
        return "cannot read: no such file or directory (removed, or a dangling symlink)"
    return f"cannot read: {exc.strerror or exc}"


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "special file"


def parse(docs: Iterable[tuple[str, dict[str, Any]]]) -> tuple[Desired | None, list[ConfigError]]:
    """Merge parsed TOML documents (in order) and validate the result."""
    merger = _Merger()
    for file, doc in docs:
        merger.add(file, doc)
    errors: list[ConfigError] = []
    try:
        desired = validate(Desired, merger.merged)
    except SpecError as exc:
        for loc, message in exc.problems:
            file, path = merger.origin(loc)
            errors.append(ConfigError(file, path, message))
        return None, errors
    errors.extend(_cross_checks(desired, merger))
    return (None if errors else desired), errors


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
                return file, render(file_loc + loc[cut:])
        return self._last_file, render(loc)

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
        objects = self.merged.get(section)
        if not isinstance(objects, list):
            # An earlier file gave the section a wrong shape; a later list replaces it.
            objects = self.merged[section] = []
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
            if section == "sriov" and isinstance(item, dict) and isinstance(item.get("vf"), list):
                objects[index]["vf"] = []
                for j, vf in enumerate(item["vf"]):
                    self._add_vf(file, index, i, j, vf)
            return
        target = objects[index]
        for key, value in item.items():
            if key == "vf" and section == "sriov" and isinstance(value, list):
                if not isinstance(target.get("vf"), list):
                    target["vf"] = []  # replaces an earlier wrong shape, as for sections
                self._set((section, index, "vf"), file, (section, i, "vf"))
                for j, vf in enumerate(value):
                    self._add_vf(file, index, i, j, vf)
            else:
                target[key] = value
                self._set((section, index, key), file, (section, i, key))

    def _add_vf(self, file: str, pf_index: int, file_pf: int, j: int, vf: Any) -> None:
        vfs: list[Any] = self.merged["sriov"][pf_index]["vf"]  # callers made it a list
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
