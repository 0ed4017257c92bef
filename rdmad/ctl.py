"""rdmad-ctl: the operator's client for the daemon's local UNIX-socket API.

Standard library only: it must start in tens of milliseconds on a loaded node,
so it imports none of the daemon's stack (an import-linter contract holds this).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
from typing import Any

from rdmad import __version__

DEFAULT_SOCKET = "/run/rdmad/rdmad.sock"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _get(sock_path: str, url: str, timeout: float) -> Any:
    conn = _UnixHTTPConnection(sock_path, timeout)
    try:
        conn.request("GET", url)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(
                f"the daemon answered {resp.status}: {body.decode(errors='replace')}"
            )
        return json.loads(body)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rdmad-ctl", description="Ask the running rdmad daemon.")
    p.add_argument("--version", action="version", version=f"rdmad-ctl {__version__}")
    p.add_argument(
        "--socket", default=DEFAULT_SOCKET, help=f"API socket (default {DEFAULT_SOCKET})"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("status", help="the node at a glance")
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    try:
        data = _get(args.socket, "/v1/status", args.timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        print(
            f"rdmad-ctl: rdmad is not running (nothing listens on {args.socket})", file=sys.stderr
        )
        return 1
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"rdmad-ctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
