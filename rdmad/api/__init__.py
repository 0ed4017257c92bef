"""The local API (docs/API.md): versioned JSON over HTTP on a UNIX socket.

``unixsock`` makes the socket (final owner and mode before it listens), ``auth``
decides who may ask (SO_PEERCRED), ``errors`` keeps every error JSON and the
load bounded, ``documents`` builds the JSON from the store's snapshots,
``waiting`` waits for the agent to answer a trigger, ``events`` streams changes,
``routes`` are the endpoints and ``server`` starts and stops it all. The API sees
the agent only through the status store and the trigger queue.

``ApiServer`` and ``SocketError`` are imported on first use: the daemon makes its
socket (``unixsock``, standard library only) before READY=1, while aiohttp, which
the server needs, is imported once the first pass rests (rdmad.services).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rdmad.api.server import ApiServer
    from rdmad.api.unixsock import SocketError

__all__ = ["ApiServer", "SocketError"]


def __getattr__(name: str) -> object:
    if name == "ApiServer":
        from rdmad.api.server import ApiServer

        return ApiServer
    if name == "SocketError":
        from rdmad.api.unixsock import SocketError

        return SocketError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
