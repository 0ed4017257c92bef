"""Replacing a file so that a reader sees the old one or the new one, never half.

A temp file in the same directory (its name starts with '.' and ends in '.tmp', so
modprobe.d, node_exporter's textfile collector and rdmad itself ignore it), fsync,
rename over the target, fsync of the directory so the rename survives a crash.
Standard library only: the guard and rdmad-ctl use it too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``); raises OSError, leaves no temp."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # mkstemp makes it 0600
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)  # the rename itself must survive a crash
    finally:
        os.close(dfd)


def write_or_remove(path: str | os.PathLike[str], data: bytes | None) -> None:
    """``write_atomic`` for a file that exists only while it says something: None removes
    it (already gone is fine). rdmad's modprobe.d files."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    write_atomic(path, data)
