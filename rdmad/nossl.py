"""The ``ssl`` module kept out of the daemon until its services import.

asyncio imports ``ssl`` when it can (``base_events``, ``selector_events``,
``sslproto``: each ``try: import ssl`` / ``except ImportError: ssl = None``, the path a
Python built without OpenSSL takes), and with it ``_ssl``, libssl and libcrypto: 5.4 MB
of libraries to map and relocate, the largest files the daemon's start reads. The
first pass never speaks TLS, and neither does the daemon afterwards (a UNIX socket,
plain HTTP on loopback). So ``rdmad run`` marks ``ssl`` as absent before asyncio's
first import (a ``None`` in ``sys.modules`` makes ``import ssl`` raise ImportError, as
the import system documents) and lifts the mark before the API and metrics import
(``rdmad.services``): ``prometheus_client`` imports ``ssl`` unconditionally, and that
import runs in a worker thread once the first pass rests. asyncio keeps its ``ssl =
None``: a TLS connection on the daemon's loop would be refused, and it opens none.
The guard (``rdmad.guard.cli``, inside ``modprobe -r``) defers it too, and never lifts it.

Standard library only: called before anything else of the daemon is imported.
bench/NOTES.md, "ssl kept out of the first pass", has the figures.
"""

from __future__ import annotations

import sys

NAME = "ssl"


def defer() -> bool:
    """Mark ``ssl`` absent unless something imported it already; True if marked."""
    if NAME in sys.modules:
        return False
    sys.modules[NAME] = None  # type: ignore[assignment]  # the import system's "absent"
    return True


def allow() -> None:
    """Lift ``defer``'s mark: the next ``import ssl`` loads it."""
    if NAME in sys.modules and sys.modules[NAME] is None:
        del sys.modules[NAME]
