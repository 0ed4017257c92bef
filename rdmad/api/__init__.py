"""The local API (docs/API.md): versioned JSON over HTTP on a UNIX socket.

``unixsock`` makes the socket (final owner and mode before it listens), ``auth``
decides who may ask (SO_PEERCRED), ``errors`` keeps every error JSON and the
load bounded, ``documents`` builds the JSON from the store's snapshots,
``waiting`` waits for the agent to answer a trigger, ``events`` streams changes,
``routes`` are the endpoints and ``server`` starts and stops it all. The API sees
the agent only through the status store and the trigger queue.
"""

from rdmad.api.server import ApiServer
from rdmad.api.unixsock import SocketError

__all__ = ["ApiServer", "SocketError"]
