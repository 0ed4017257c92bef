"""The names callers imported from the former one-module rtnetlink layer, kept importable.

The layer is now one job per module: ``nlsock`` (socket transport), ``nlcodec``
(netlink framing), ``rtnl_codec`` (link messages), ``rtnl_vf_attrs`` (VF attributes,
incl. the VLAN protocol), ``vf_apply`` (VF apply + fallback + read-back),
``rtnetlink`` (``RtNetlink``), ``linkevents`` (``LinkEventStream``). New code imports
from those; this module goes once no caller imports it.
"""

from __future__ import annotations

from rdmad.kernel.errors import KernelError
from rdmad.kernel.linkevents import EVENTS_RCVBUF, LinkEvent, LinkEventStream
from rdmad.kernel.nlcodec import NlMsg, parse_error, split_messages
from rdmad.kernel.nlsock import NetlinkFailure, NetlinkTransport, open_netlink_socket
from rdmad.kernel.rtnetlink import RtNetlink as _RtNetlink
from rdmad.kernel.rtnl_codec import LinkInfo
from rdmad.kernel.vf_apply import VfChangeResult


class RtNetlink(_RtNetlink):
    """``rtnetlink.RtNetlink`` plus ``events()`` for callers written against the old module."""

    def events(self, rcvbuf: int = EVENTS_RCVBUF) -> LinkEventStream:
        """Subscribe to link events now: ``LinkEventStream(netns)``."""
        return LinkEventStream(self.netns, rcvbuf)


__all__ = [
    "KernelError",
    "LinkEvent",
    "LinkEventStream",
    "LinkInfo",
    "NetlinkFailure",
    "NetlinkTransport",
    "NlMsg",
    "RtNetlink",
    "VfChangeResult",
    "open_netlink_socket",
    "parse_error",
    "split_messages",
]
