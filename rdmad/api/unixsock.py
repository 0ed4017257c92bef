"""The API's listening UNIX socket, created with its final owner and mode.

The socket is bound inside a fresh private directory (0700, beside the final
path), given its owner (root:read_group) and mode (0660) there, set listening,
and only then renamed into place. So there is no moment where the path answers
with a wrong mode, and no process-wide umask change (the daemon runs threads that
create files). A socket file already at the path is replaced only when nothing
listens on it; a live listener (another rdmad) or a file that is not a socket is
refused, never removed.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

GROUP_MODE = 0o660
ROOT_ONLY_MODE = 0o600
PARENT_MODE = 0o755
BACKLOG = 128


class SocketError(Exception):
    """The API socket cannot be created; the message says why, naming the path."""


@dataclass(frozen=True, slots=True)
class Listening:
    """A bound, listening socket and what it was made with."""

    sock: socket.socket
    path: Path
    mode: int
    gid: int
    inode: int  # to remove only our own socket file at close
    note: str = ""  # e.g. the read group does not exist, so the socket is root-only


def group_id(name: str | None) -> int | None:
    """The gid of a group name, or None when there is no such group (or no name). A
    number is a gid as it is: in a container the host's groups are not in /etc/group."""
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def listen(path: Path, read_group: str) -> Listening:
    """Create the API socket at ``path`` for root and ``read_group``; raise SocketError."""
    gid = group_id(read_group)
    note = ""
    if gid is None:
        mode, gid = ROOT_ONLY_MODE, os.getegid()
        note = f"group {read_group!r} does not exist: the API socket is root-only"
    else:
        mode = GROUP_MODE
    _ensure_parent(path.parent)
    _clear_stale(path)
    try:
        private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        where = path.parent
        raise SocketError(f"{where}: cannot create a directory there: {exc.strerror}") from exc
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        staged = private / "sock"
        sock.bind(str(staged))
        os.chown(staged, os.geteuid(), gid)
        os.chmod(staged, mode)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        os.rename(staged, path)
        inode = os.lstat(path).st_ino
    except OSError as exc:
        sock.close()
        raise SocketError(f"{path}: cannot create the API socket: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            for leftover in private.iterdir():
                leftover.unlink()
        with contextlib.suppress(OSError):
            private.rmdir()
    return Listening(sock, path, mode, gid, inode, note)


def remove(listening: Listening) -> None:
    """Close the socket and remove its file, if the file is still ours."""
    listening.sock.close()
    with contextlib.suppress(OSError):
        if os.lstat(listening.path).st_ino == listening.inode:
            listening.path.unlink()


def _ensure_parent(parent: Path) -> None:
    if parent.is_dir():
        return
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, PARENT_MODE)  # not left to the umask
    except OSError as exc:
        why = exc.strerror
        raise SocketError(f"{parent}: cannot create the socket's directory: {why}") from exc


def _clear_stale(path: Path) -> None:
    """Remove a socket file nothing listens on; refuse a live one or anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketError(f"{path}: cannot check it: {exc.strerror}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketError(f"{path}: cannot tell whether it is in use: {exc.strerror}") from exc
    else:
        raise SocketError(f"{path}: another process (another rdmad?) listens there")
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
