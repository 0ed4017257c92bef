"""rtnetlink requests: list links with their VF settings, bring a link up, set VF settings.

One ``RtNetlink`` per network namespace; requests go over the shared transport
(``nlsock``), are encoded by ``rtnl_codec``/``rtnl_vf_attrs`` and VF changes are applied
by ``vf_apply``. Link events are a separate socket and module (``linkevents``).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from rdmad.kernel.errors import KernelError
from rdmad.kernel.netlink.nlcodec import NLM_F_DUMP
from rdmad.kernel.netlink.nlsock import NetlinkFailure, NetlinkTransport
from rdmad.kernel.netlink.rtnl_codec import (
    RTM_GETLINK,
    RTM_NEWLINK,
    RTM_SETLINK,
    LinkInfo,
    encode_getlink,
    encode_getlink_dump,
    encode_set_up,
    parse_link,
)
from rdmad.kernel.netlink.vf_apply import Piece, VfChangeResult, apply_vf_changes, encode_pieces
from rdmad.model import VfChange, VfSettings

NETLINK_ROUTE = 0


class RtNetlink:
    """rtnetlink access for one network namespace (default: the daemon's own)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._nl = NetlinkTransport(NETLINK_ROUTE, netns)

    def close(self) -> None:
        self._nl.close()

    async def __aenter__(self) -> RtNetlink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def links(self, vfs: bool = True) -> list[LinkInfo]:
        """Every link of the namespace, with VF settings, in one RTM_GETLINK dump.

        IFLA_EXT_MASK asks for VFs but not their statistics, so 256 VFs fit the kernel's
        message (FIELD.md: truncation). A dump interrupted by a concurrent change is retried.
        ``vfs`` False leaves the VF lists out (the event path's cheap read of netdevs).
        """
        payload = encode_getlink_dump(vfs)
        for attempt in range(3):
            try:
                replies = await self._nl.request(RTM_GETLINK, NLM_F_DUMP, payload)
            except NetlinkFailure as exc:
                if exc.errno == errno.EINTR and attempt < 2:
                    continue
                raise KernelError("list links", self._where(), exc.errno, exc.message) from None
            except OSError as exc:
                raise KernelError("list links", self._where(), exc.errno, str(exc)) from None
            return [parse_link(m.data) for m in replies if m.type == RTM_NEWLINK]
        raise AssertionError("unreachable")

    async def link(self, target: int | str) -> LinkInfo:
        """One link by ifindex or name, with its VF settings."""
        op = f"read {_label(target)}"
        try:
            replies = await self._nl.request(RTM_GETLINK, 0, encode_getlink(target))
        except NetlinkFailure as exc:
            raise KernelError(op, self._where(), exc.errno, exc.message) from None
        except OSError as exc:
            raise KernelError(op, self._where(), exc.errno, str(exc)) from None
        for m in replies:
            if m.type == RTM_NEWLINK:
                return parse_link(m.data)
        raise KernelError(op, self._where(), errno.ENODEV, "no reply")

    async def set_up(self, link: int | str) -> None:
        await self._call(f"set {_label(link)} up", RTM_SETLINK, encode_set_up(link))

    async def set_vf_settings(
        self,
        link: int | str,
        changes: Sequence[VfChange],
        current: Mapping[int, VfSettings],
    ) -> list[VfChangeResult]:
        """Apply VF changes on the PF ``link`` (ifindex or name), one result per change.

        One batched RTM_SETLINK when the kernel accepts it, per-VF and per-attribute
        messages to find what it refused, then the PF's VF list read back so that a value
        the driver did not keep is reported (see ``vf_apply``).
        """

        async def send(pieces: Sequence[Piece]) -> NetlinkFailure | None:
            try:
                await self._nl.request(RTM_SETLINK, 0, encode_pieces(link, pieces))
            except NetlinkFailure as exc:
                return exc
            except OSError as exc:
                return NetlinkFailure(exc.errno or errno.EIO, str(exc))
            return None

        async def read_back() -> Mapping[int, VfSettings]:
            return (await self.link(link)).vfs

        return await apply_vf_changes(send, read_back, _label(link), changes, current)

    async def _call(self, op: str, mtype: int, payload: bytes) -> None:
        try:
            await self._nl.request(mtype, 0, payload)
        except NetlinkFailure as exc:
            raise KernelError(op, self._where(), exc.errno, exc.message) from None
        except OSError as exc:
            raise KernelError(op, self._where(), exc.errno, str(exc)) from None

    def _where(self) -> str:
        return f"netns {self.netns}" if self.netns else "this host"


def _label(link: int | str) -> str:
    return link if isinstance(link, str) else f"ifindex {link}"
