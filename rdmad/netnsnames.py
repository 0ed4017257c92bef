"""Network namespaces besides rdmad's own, named by what keeps them alive.

The kernel switches the RDMA subsystem between ``shared`` and ``exclusive`` only while
no network namespace but the initial one exists (``rdma_compatdev_set`` answers EBUSY
otherwise): a container, an ``ip netns`` namespace or a unit with ``PrivateNetwork=``
blocks the change. Before planning it, rdmad looks for them to name them in status
("'blue' (ip netns); pid 4121 (pause) and 3 more"), so the operator knows what stands
in the way; the kernel's answer stays the last word (a namespace kept only by a socket
or a bind mount elsewhere is not seen here, and the write then fails with EBUSY).

One stat per process (``/proc/PID/ns/net``) and per ``/run/netns`` entry, compared by
(device, inode) with ``/proc/self/ns/net``. What is read here names; it never decides
alone: a change the kernel refuses fails atomically (EBUSY), so a process whose
namespace cannot be read (EACCES: another user namespace's) is counted, not guessed,
and "none known" lets the kernel answer. Only a /proc that cannot be listed, or the
caller's own namespace unreadable, raises OSError.

Standard library only, under a root it is given (``path``, ``read``): the daemon
(``rdmad.kernel.ibcore``, through ``Sysfs``) and ``rdmad-ctl doctor`` (through its
read-only root) name the same namespaces with the same words, and read the mode from
the same parameter with the same table. Nothing is opened: only
stat and listdir.
"""

from __future__ import annotations

import errno
import os
from typing import NamedTuple, Protocol

# ib_core's netns_mode parameter: the live mode, and (as an option) the mode ib_core
# starts in. Its values as sysfs shows them (Y/N) and as modprobe.d gives them (1/0).
NETNS_MODE_PARAM = "sys/module/ib_core/parameters/netns_mode"
NETNS_MODES = {"Y": "shared", "N": "exclusive", "1": "shared", "0": "exclusive"}


class Root(Protocol):
    def path(self, rel: str) -> str: ...

    def read(self, rel: str) -> str | None: ...


_PIDS_NAMED = 2  # per namespace, in messages


_GONE = (errno.ENOENT, errno.ESRCH)


def _ns(root: Root, rel: str) -> tuple[int, int] | None:
    """(device, inode) of a namespace file; None when its process is gone, OSError when
    it cannot be read."""
    try:
        st = os.stat(root.path(rel))
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise
    return (st.st_dev, st.st_ino)


class OtherNamespaces(NamedTuple):
    labels: tuple[str, ...]  # one per namespace besides rdmad's, in a stable order
    unreadable: int = 0  # processes and /run/netns entries whose namespace was not readable


def _listdir(root: Root, rel: str, optional: bool = False) -> list[str]:
    try:
        return sorted(os.listdir(root.path(rel)))
    except FileNotFoundError:
        if optional:
            return []
        raise


def other_namespaces(root: Root) -> OtherNamespaces:
    """The network namespaces other than this process's that can be seen, named.
    OSError when /proc cannot be listed or this process's own namespace read."""
    own = _ns(root, "proc/self/ns/net")
    if own is None:
        raise FileNotFoundError(errno.ENOENT, "no /proc/self/ns/net")
    unreadable = 0
    names: dict[tuple[int, int], list[str]] = {}
    pids: dict[tuple[int, int], list[str]] = {}
    listed = [(n, f"run/netns/{n}", names) for n in _listdir(root, "run/netns", optional=True)]
    procs = sorted((p for p in _listdir(root, "proc") if p.isdigit()), key=int)
    listed += [(p, f"proc/{p}/ns/net", pids) for p in procs]
    for key, path, into in listed:
        try:
            ns = _ns(root, path)
        except OSError:
            unreadable += 1
            continue
        if ns is not None and ns != own:
            into.setdefault(ns, []).append(key)
    labels = []
    for ns in sorted(set(names) | set(pids), key=lambda n: _first_pid(pids.get(n))):
        parts = [", ".join(repr(n) for n in names.get(ns, ()))]
        if ns in names:
            parts[0] += " (ip netns)"
        in_it = pids.get(ns, [])
        if in_it:
            more = len(in_it) - _PIDS_NAMED
            shown = ", ".join(f"pid {p} ({_comm(root, p)})" for p in in_it[:_PIDS_NAMED])
            parts.append(shown + (f" and {more} more" if more > 0 else ""))
        labels.append(": ".join(p for p in parts if p))
    return OtherNamespaces(tuple(labels), unreadable)


def _comm(root: Root, pid: str) -> str:
    """A process's name, for messages only: "?" when it cannot be read."""
    try:
        return root.read(f"proc/{pid}/comm") or "?"
    except OSError:
        return "?"


def _first_pid(pids: list[str] | None) -> int:
    return int(pids[0]) if pids else -1
