"""The metrics TCP listener's sockets, bound and listening before aiohttp is imported.

Standard library only, as ``unixsock``: the daemon binds them before READY=1 while
aiohttp is imported once the first pass rests (rdmad.services), so a scraper
that connects early waits in the backlog instead of being refused. ``metrics_http``
serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket

BACKLOG = 128


class ListenError(ValueError):
    """A ``listen`` value that is not host:port."""


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9478"`` -> ("127.0.0.1", 9478); ``"[::1]:9478"`` -> ("::1", 9478).

    Port 0 asks the kernel for a free port (tests).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ListenError(f"listen: expected host:port or [v6-address]:port, got {value!r}")
    port = int(port_text)
    if port > 65535:
        raise ListenError(f"listen: port {port} is out of range (0-65535) in {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ListenError(f"listen: {host!r} is not an IPv6 address in {value!r}") from exc
    elif ":" in host:
        raise ListenError(f"listen: write an IPv6 address in brackets: [{host}]:{port}")
    return host, port


async def bind(listen: str) -> list[socket.socket]:
    """Listening sockets on every address ``listen``'s host names (as asyncio's
    create_server binds them: SO_REUSEADDR, IPv6 sockets IPv6 only). Raises ListenError
    or OSError (address in use, not local)."""
    host, port = parse_listen(listen)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        close(sockets)
        raise
    return sockets


def close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
