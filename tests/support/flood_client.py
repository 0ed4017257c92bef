"""A local user holding many idle connections to one of rdmad's listeners.

Standard library only: run as another user (``python3 -I flood_client.py ...``) on the
test host or in a lab guest. It opens ``-n`` connections and sends nothing on them.
With ``--hold S`` it keeps trying for S seconds: every ``--every`` seconds the
connections the server closed (refused at once, or idle too long) are opened again;
SIGUSR1 ends the hold early (a test that has measured what it needs says so).
Without it, it waits for a line on stdin, then reports and waits for stdin to close.

Prints JSON lines: ``{"phase": "opened", ...}`` once the first round is open, with
``--hold`` the counts so far after each round (``{"phase": "round", ...}``), and
``{"phase": "report", "held": H, "closed_by_server": C, "refused": R, "connects": N,
"connect_failed": F, "max_held": M}`` at the end (H: still open now; C: closed by
the server over the whole run, R of them refused with a 503; N: successful connects;
F: connects that failed or timed out; M: the most held open at once).

A UNIX socket's connect to a full listen backlog fails at once (EAGAIN) rather than
waiting: ``--backlog-wait S`` has it wait up to S seconds for room, so that how many
connections a user holds depends on the server's limits, not on how fast it drained
its backlog at that moment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from types import FrameType


class HoldEnded(Exception):
    """SIGUSR1 arrived while holding: stop reopening, report now."""


class Flood:
    def __init__(self, target: str, address: str, backlog_wait: float = 0.0) -> None:
        self.target = target
        self.address = address
        self.backlog_wait = backlog_wait
        self.sel = selectors.DefaultSelector()
        self.held: set[socket.socket] = set()
        self.closed_by_server = 0
        self.refused = 0
        self.connects = 0
        self.connect_failed = 0
        self.max_held = 0

    def connect(self) -> None:
        if self.target == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            where: str | tuple[str, int] = self.address
        else:
            host, _, port = self.address.rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            where = (host.strip("[]"), int(port))
        sock.settimeout(1.0)  # a full backlog: give up on this one, do not hang
        if self.target == "unix" and self.backlog_wait > 0:
            # AF_UNIX answers a full backlog with EAGAIN at once on a non-blocking socket
            # (settimeout makes it one), not with a wait as TCP does. A blocking connect
            # waits in the kernel up to SO_SNDTIMEO, woken at the server's next accept,
            # as rdmad-ctl's does.
            whole = int(self.backlog_wait)
            usec = int((self.backlog_wait - whole) * 1_000_000)
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", whole, usec))
        try:
            sock.connect(where)
        except OSError:
            self.connect_failed += 1
            sock.close()
            return
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ)
        self.held.add(sock)
        self.connects += 1
        self.max_held = max(self.max_held, len(self.held))

    def reap(self, timeout: float) -> None:
        """Count and close the connections the server closed (EOF or a 503, then EOF)."""
        for key, _ in self.sel.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data and not data.startswith(b"HTTP/1.1 503"):
                continue  # something else: keep reading
            self.sel.unregister(sock)
            self.held.discard(sock)
            sock.close()
            self.closed_by_server += 1
            self.refused += data.startswith(b"HTTP/1.1 503")

    def settle(self, quiet: float = 0.3) -> None:
        """Reap until the server has closed nothing more for ``quiet`` seconds."""
        while self.sel.get_map() and self.sel.select(quiet):
            self.reap(0)

    def report(self, phase: str = "report") -> dict[str, object]:
        return {
            "phase": phase,
            "held": len(self.held),
            "closed_by_server": self.closed_by_server,
            "refused": self.refused,
            "connects": self.connects,
            "connect_failed": self.connect_failed,
            "max_held": self.max_held,
        }


def hold(flood: Flood, n: int, seconds: float, every: float) -> None:
    """Reopen what the server closed every ``every`` s for ``seconds``, or until SIGUSR1
    (which, once the hold is over, changes nothing)."""
    holding = True

    def end_hold(signum: int, frame: FrameType | None) -> None:
        if holding:
            raise HoldEnded

    end = time.monotonic() + seconds
    signal.signal(signal.SIGUSR1, end_hold)
    try:
        try:
            while time.monotonic() < end:
                round_end = min(end, time.monotonic() + every)
                while (left := round_end - time.monotonic()) > 0:
                    flood.reap(left)
                for _ in range(n - len(flood.held)):
                    flood.connect()
                print(json.dumps(flood.report("round")), flush=True)
        finally:
            holding = False  # a signal before this line still lands in the except below
    except HoldEnded:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target", choices=["unix", "tcp"])
    p.add_argument("address", help="socket path, or host:port")
    p.add_argument("-n", type=int, required=True, help="connections to hold")
    p.add_argument("--hold", type=float, default=None, help="seconds to keep reopening")
    p.add_argument("--every", type=float, default=0.2, help="seconds between reopenings")
    p.add_argument(
        "--backlog-wait",
        type=float,
        default=0.0,
        help="seconds a connect waits for room in a full AF_UNIX backlog (default: fail at once)",
    )
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flood = Flood(args.target, args.address, args.backlog_wait)
    for _ in range(args.n):
        flood.connect()
    print(json.dumps({"phase": "opened", "connects": flood.connects}), flush=True)
    if args.hold is not None:
        hold(flood, args.n, args.hold, args.every)
        flood.settle()
        print(json.dumps(flood.report()), flush=True)
        return 0
    sys.stdin.readline()  # "report"
    flood.settle()
    print(json.dumps(flood.report()), flush=True)
    sys.stdin.read()  # hold until told to go
    return 0


if __name__ == "__main__":
    sys.exit(main())
