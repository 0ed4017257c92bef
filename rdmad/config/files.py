"""Reading the config files: which files make up the config and each one as TOML.

Layout: ``DIR/rdmad.toml`` plus ``DIR/rdmad.d/*.toml`` applied in name order
(names starting with a dot are not config files).

Anything on disk that cannot be read as a config (not UTF-8, over 1 MiB, a directory,
FIFO, symlink loop, a file gone between listing and reading) is a ``ConfigError``, never
an exception: the daemon keeps running on its last good config. So is a file that
someone other than root could change (group- or world-writable, or, when rdmad runs as
root, not owned by root): its content would be root's orders from a non-root user.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from rdmad.config.errors import ConfigError
from rdmad.tomlcompat import tomllib

DEFAULT_DIR = Path("/etc/rdmad")
MAIN_FILE = "rdmad.toml"
DROPIN_DIR = "rdmad.d"
# A declaration of thousands of VFs is well under 1 MiB; anything larger is a mistake
# (a log or image copied into rdmad.d) and reading it whole would cost the daemon memory.
MAX_FILE_BYTES = 1024 * 1024


def config_files(location: Path) -> list[Path]:
    """The files that make up the config at ``location`` (a dir or one file).

    Problems finding them are left to ``load()``, which reports them; this only lists.
    """
    files, _ = discover(location)
    return files


def discover(location: Path) -> tuple[list[Path], list[ConfigError]]:
    """List the config files; every entry that cannot be a config file is an error.

    A drop-in named ``*.toml`` that is a directory, a dangling symlink or a symlink
    loop is an error rather than silently skipped: its author meant it to count.
    Hidden names (``.#x.toml`` editor locks, ``.x.toml.tmp``) are not config files.
    """
    errors: list[ConfigError] = []
    try:
        mode = location.stat().st_mode
    except OSError as exc:
        return [], [ConfigError(display(location), "", _os_problem(exc))]
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
            errors.append(ConfigError(display(dropins), "", _os_problem(exc)))
            names = []
        files.extend(dropins / n for n in names if n.endswith(".toml") and not n.startswith("."))
    return files, errors


def read_document(path: Path) -> tuple[dict[str, Any] | None, ConfigError | None]:
    """One file as TOML, or the reason it cannot be read, naming the file.

    Opened non-blocking and checked to be a regular file before reading, so a FIFO
    or device named ``*.toml`` cannot hang the daemon; read with a size limit so a
    runaway file cannot exhaust its memory.
    """
    name = display(path)
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


def read_all(
    location: Path,
) -> tuple[list[Path], list[tuple[str, dict[str, Any]]], list[ConfigError]]:
    """The config files at ``location``, the documents that read, and what did not."""
    files, errors = discover(location)
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        doc, problem = read_document(path)
        if problem is not None:
            errors.append(problem)
        elif doc is not None:
            docs.append((display(path), doc))
    return files, docs, errors


def display(path: Path) -> str:
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
