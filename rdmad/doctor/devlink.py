"""The doctor's devlink read: each PF's eSwitch (``devlink dev eswitch show``), over a
blocking generic netlink socket.

The messages are the daemon's own (``rdmad.kernel.netlink.devlink_codec``: bytes in,
values out, standard library only; the one exception to the doctor's contract in
pyproject.toml). The daemon's client is asynchronous and lives beside the kernel
layer's sockets; the doctor asks a handful of questions once, so a plain socket with a
timeout is all it needs, and rdmad-ctl still imports nothing but the standard library.

Reading an eSwitch is a privileged devlink command (CAP_NET_ADMIN): as another user the
answer is EPERM, which the check reports as "not read", never as "no eSwitch".
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable

from rdmad.doctor.eswitch import Seen
from rdmad.kernel.netlink.devlink_codec import (
    NETLINK_GENERIC,
    NO_ESWITCH,
    eswitch_get_request,
    family_request,
    handle,
    parse_eswitch,
    parse_family,
)
from rdmad.kernel.netlink.nlcodec import (
    NLM_F_MULTI,
    NLMSG_DONE,
    NLMSG_ERROR,
    NlMsg,
    parse_error,
    split_messages,
)

TIMEOUT = 2.0  # seconds per answer: devlink answers from memory


class HostDevlink:
    """devlink of the doctor's own network namespace; the socket opens at the first
    question, so a node with no PF declared never opens one."""

    def __init__(self, connect: Callable[[], socket.socket] | None = None) -> None:
        self._connect = connect or _genl_socket
        self._sock: socket.socket | None = None
        self._family: int | None = None
        self._seq = 0
        self._no_devlink = ""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __call__(self, pf: str) -> Seen:
        """The eSwitch of ``pf`` (a PCI address, or a netdevsim device's name)."""
        bus, dev = handle(pf)
        if self._no_devlink:
            return Seen(absent=self._no_devlink)
        try:
            family = self._family_id()
            if not family:
                return Seen(absent=self._no_devlink)
            replies = self._ask(lambda seq: eswitch_get_request(family, seq, bus, dev))
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                return Seen(absent=f"its driver registers no devlink instance {bus}/{dev}")
            if exc.errno in NO_ESWITCH:
                return Seen(absent="its driver has none")
            why = exc.strerror or str(exc)
            if exc.errno == errno.EPERM:
                why += " (reading an eSwitch needs CAP_NET_ADMIN: run as root)"
            return Seen(unread=why)
        if not replies:
            return Seen(unread="devlink gave no answer")
        es = parse_eswitch(replies[0])
        if es.mode is None:
            return Seen(absent="its driver has none")
        return Seen(es.mode, es.inline_mode, es.encap_mode)

    def _family_id(self) -> int:
        if self._family is None:
            try:
                self._family = parse_family(self._ask(family_request)[0]).id
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                self._family = 0
                self._no_devlink = "this kernel has no devlink"
        return self._family

    def _ask(self, build: Callable[[int], bytes]) -> list[NlMsg]:
        """One request, its answers until the last (or its error, raised as OSError)."""
        if self._sock is None:
            self._sock = self._connect()
        self._seq += 1
        self._sock.send(build(self._seq))
        out: list[NlMsg] = []
        while True:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT)) from None
            for msg in split_messages(data):
                if msg.seq != self._seq:
                    continue  # a late answer to an earlier question
                if msg.type == NLMSG_ERROR:
                    code, text = parse_error(msg)
                    if code:
                        raise OSError(code, text or os.strerror(code))
                    return out
                if msg.type == NLMSG_DONE:
                    return out
                out.append(msg)
                if not msg.flags & NLM_F_MULTI:
                    return out


def _genl_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    sock.settimeout(TIMEOUT)
    sock.bind((0, 0))
    return sock
