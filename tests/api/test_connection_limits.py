"""Local users cannot exhaust the daemon: connections are bounded per user and in all,
root keeps slots of its own, idle TCP connections are closed, and an accept that fails
for want of a descriptor pauses accepting instead of spinning (logged once).

The floods run as other users (uid nobody and a few unnamed uids, in a group allowed to
read) from tests/support/flood_client.py; the server runs in this process, with its
descriptor limit lowered so that a flood that were not bounded would exhaust it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from rdmad.api import admission
from rdmad.api.metrics import Metrics
from rdmad.api.metrics_http import IDLE_SECONDS, MetricsListener, start_tcp_listener
from rdmad.status import StatusStore
from rdmad.triggers import TriggerQueue
from tests.support.fakeclock import FakeClock

from .conftest import ApiFactory, require_root

REPO = Path(__file__).resolve().parents[2]
FLOOD = (REPO / "tests/support/flood_client.py").read_text()
# The flood client needs the standard library only; the venv's interpreter may sit
# where other users cannot reach it.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
ROOT_BOUND = 2.0  # seconds root's status may take during a flood (rdmad-ctl waits 5)


@contextlib.contextmanager
def fd_limit(room: int) -> Iterator[int]:
    """This process's soft descriptor limit set to what it has open plus ``room``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + room, hard))
    try:
        yield open_now + room
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Flooder:
    """flood_client.py as ``uid``, holding ``n`` idle connections until closed."""

    def __init__(
        self, uid: int, gid: int, target: str, address: str, n: int, backlog_wait: float = 0.0
    ) -> None:
        argv = [target, address, "-n", str(n), "--backlog-wait", str(backlog_wait)]
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-I", "-c", FLOOD, *argv],
            user=uid,
            group=65534,
            extra_groups=[gid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(60):
            text = await asyncio.to_thread(self.proc.stdout.readline)
        assert text, "the flood client ended early"
        return dict(json.loads(text))

    async def report(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return await self.line()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Root's client: another process (as `rdmad-ctl status` is), started before the flood
# so that this process's descriptors are the server's alone. One request per line read.
PROBE = """
import json, socket, struct, sys, time
for _ in sys.stdin:
    started = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # As rdmad-ctl connects: waiting in the kernel for room in a full backlog, up to its
    # default --timeout (a socket with settimeout() would fail at once with EAGAIN).
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", 5, 0))
    try:
        s.connect(sys.argv[1])
        s.settimeout(5.0)
        s.sendall(b"GET /v1/status HTTP/1.1\\r\\nHost: rdmad\\r\\nConnection: close\\r\\n\\r\\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        head = answer.split(b"\\r\\n", 1)[0].decode()
    except OSError as exc:
        head = f"no answer: {exc}"
    finally:
        s.close()
    print(json.dumps({"head": head, "seconds": time.monotonic() - started}), flush=True)
"""


class RootProbe:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", PROBE, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def status(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("status\n")
        self.proc.stdin.flush()
        async with asyncio.timeout(30):
            return dict(json.loads(await asyncio.to_thread(self.proc.stdout.readline)))

    async def answers_quickly(self) -> float:
        got = await self.status()
        assert got["head"].startswith("HTTP/1.1 200 "), got
        assert got["seconds"] < ROOT_BOUND, got
        return float(got["seconds"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


async def test_a_flood_from_local_users_leaves_root_its_status(
    make_api: ApiFactory, temp_group: str
) -> None:
    """Issue 42: idle connections from unprivileged users took every descriptor; the
    daemon's accepts failed with EMFILE and root's `rdmad-ctl status` timed out."""
    require_root("clients as other uids")
    # Held for the whole test: the API's own timeout (5 s) would close idle ones.
    api = await make_api(read_group=temp_group, request_timeout=60)
    gid = grp.getgrnam(temp_group).gr_gid
    limits = admission.API_LIMITS
    assert limits.per_uid is not None
    uids = [65534, 40001, 40002, 40003, 40004]  # nobody, then users with no name
    per_flooder = 60
    flooders: list[Flooder] = []
    root = RootProbe(api.socket)
    await root.answers_quickly()
    with fd_limit(room=250):  # 300 connections unbounded would take them all
        try:
            # Each connect waits (bounded) for room in the listen backlog: without that, a
            # user's connects made while the server drained the others' failed at once
            # (EAGAIN), and the shared slots were left part empty (117 of 128, once in CI).
            wait = 1.0
            first = Flooder(uids[0], gid, "unix", str(api.socket), per_flooder, wait)
            flooders.append(first)
            assert (await first.line())["phase"] == "opened"
            # One user: no more than its share; root answers at once.
            report = await first.report()
            assert report["held"] == limits.per_uid, report
            assert report["closed_by_server"] == per_flooder - limits.per_uid, report
            await root.answers_quickly()
            # Five users: the shared slots fill up; root still has its own.
            for uid in uids[1:]:
                flooders.append(Flooder(uid, gid, "unix", str(api.socket), per_flooder, wait))
            for f in flooders[1:]:
                assert (await f.line())["phase"] == "opened"
            reports = [await f.report() for f in flooders[1:]]
            held = sum(r["held"] for r in reports) + report["held"]
            assert held == limits.connections, (held, report, reports)  # each user's counts
            for _ in range(3):
                await root.answers_quickly()
            # Each connect was held, refused at once, or (the backlog full while the
            # server refused others) not made at all; every refusal was the server's.
            for r in [report, *reports]:
                assert r["held"] + r["closed_by_server"] + r["connect_failed"] == per_flooder, r
            acceptor = api.server.acceptor
            assert acceptor is not None
            assert acceptor.refused >= sum(r["closed_by_server"] for r in [report, *reports])
        finally:
            for f in flooders:
                f.close()
            root.close()


# --- the metrics listener -------------------------------------------------------------------


@pytest.fixture
async def listener() -> AsyncIterator[tuple[MetricsListener, int]]:
    store = StatusStore()
    metrics = Metrics(store, TriggerQueue(FakeClock()))
    served = await start_tcp_listener(metrics, "127.0.0.1:0")
    [(_, port)] = served.addresses
    try:
        yield served, port
    finally:
        await served.close()
        metrics.close()


async def _closed_within(reader: asyncio.StreamReader, bound: float) -> float:
    """Seconds until the server closed the connection: end of stream, or a reset (a
    server that closes with bytes of ours still unread, the trickling client's, sends
    RST instead of FIN; which one comes depends on whether a byte arrived just before)."""
    started = time.monotonic()
    async with asyncio.timeout(bound):
        with contextlib.suppress(ConnectionResetError):
            while await reader.read(4096):
                pass
    return time.monotonic() - started


async def test_idle_and_slow_metrics_connections_are_closed(
    listener: tuple[MetricsListener, int],
) -> None:
    """A connection that sends nothing, one that sends its headers a byte at a time, and
    one left open after a scrape: each closed after IDLE_SECONDS (was: an hour)."""
    _, port = listener
    bound = IDLE_SECONDS * 2 + 5
    silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
    kept_r, kept_w = await asyncio.open_connection("127.0.0.1", port)
    kept_w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await kept_r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    await kept_r.readexactly(length)

    async def trickle() -> None:
        slow_w.write(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(int(bound * 20)):
            slow_w.write(b"X")  # one more byte of a header every 50 ms
            with contextlib.suppress(ConnectionError):
                await slow_w.drain()
            await asyncio.sleep(0.05)

    dripping = asyncio.ensure_future(trickle())
    try:
        took = await asyncio.gather(
            _closed_within(silent_r, bound),
            _closed_within(slow_r, bound),
            _closed_within(kept_r, bound),
        )
    finally:
        dripping.cancel()
        for w in (silent_w, slow_w, kept_w):
            w.close()
    assert all(t < IDLE_SECONDS + 4 for t in took), took


async def test_a_tcp_flood_is_bounded_and_scrapes_work_after(
    listener: tuple[MetricsListener, int],
) -> None:
    served, port = listener
    [acceptor] = served.acceptors
    most = acceptor.slots.limits.connections
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(most + 40)]
    try:
        async with asyncio.timeout(10):
            while acceptor.admitted + acceptor.refused < len(conns):
                await asyncio.sleep(0.01)
        assert (acceptor.admitted, acceptor.refused) == (most, 40)

        async def closed(r: asyncio.StreamReader) -> bool:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # well before the idle timeout
                    data = await r.read()
                    assert data == b"" or data.startswith(b"HTTP/1.1 503 "), data
                    return True
            return False

        assert sum(await asyncio.gather(*(closed(r) for r, _ in conns))) == 40
    finally:
        for _, w in conns:
            w.close()
    async with asyncio.timeout(10):
        while acceptor.slots.open:
            await asyncio.sleep(0.01)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await r.read()).startswith(b"HTTP/1.1 200 ")
        w.close()


# --- accept errors ------------------------------------------------------------------------------


class FailingAccept:
    """loop.sock_accept's stand-in: fails with ``error`` until ``heal()``, then hands
    out one end of a socket pair."""

    def __init__(self, error: int) -> None:
        self.error = error
        self.calls = 0
        self.healed = False
        self.pairs: list[tuple[socket.socket, socket.socket]] = []

    def heal(self) -> None:
        self.healed = True

    async def __call__(self, _sock: socket.socket) -> tuple[socket.socket, Any]:
        self.calls += 1
        if not self.healed:
            raise OSError(self.error, os.strerror(self.error))
        if self.pairs:  # one connection, then nothing more comes
            await asyncio.Event().wait()
        pair = socket.socketpair()
        self.pairs.append(pair)
        return pair[0], None


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


@pytest.mark.parametrize("error", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS])
async def test_an_accept_out_of_descriptors_pauses_and_is_logged_once(error: int) -> None:
    accept = FailingAccept(error)
    made: list[asyncio.Protocol] = []

    def factory() -> asyncio.Protocol:
        made.append(asyncio.Protocol())
        return made[-1]

    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slots = admission.Slots(admission.Limits(4))
    acceptor = admission.Acceptor(listening, factory, slots, name="t", accept=accept)
    with structlog.testing.capture_logs() as logs:
        acceptor.start()
        for _ in range(2000):  # loop turns, not time: a spinning loop would call 2000 times
            await asyncio.sleep(0)
        assert 1 <= accept.calls <= 2, accept.calls
        # Retrying, ever more slowly (up to 1 s): still one line for the whole episode.
        acceptor.pause_first = acceptor.pause_max = 0.001
        async with asyncio.timeout(10):
            while accept.calls < 20:
                await asyncio.sleep(0.001)
        assert len(_events(logs, "api.accept-paused")) == 1
        assert not _events(logs, "api.accept-resumed")
        accept.heal()
        async with asyncio.timeout(10):
            while not made:
                await asyncio.sleep(0.001)
        assert slots.open == 1  # the connection that waited is served
        [resumed] = _events(logs, "api.accept-resumed")
        assert resumed["failed_accepts"] >= 20
        assert len(_events(logs, "api.accept-paused")) == 1
    await acceptor.close()
    listening.close()
    for a, b in accept.pairs:
        a.close()
        b.close()


async def test_the_api_out_of_descriptors_pauses_then_answers(make_api: ApiFactory) -> None:
    """Real EMFILE: this process at its descriptor limit while a client waits in the
    backlog; accepting pauses (logged once), and the client is answered once
    descriptors are free again."""
    api = await make_api()
    acceptor = api.server.acceptor
    assert acceptor is not None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fillers: list[int] = []
    loop = asyncio.get_running_loop()
    answer = b""
    with structlog.testing.capture_logs() as logs:
        with fd_limit(room=0):
            with contextlib.suppress(OSError):
                while True:
                    fillers.append(os.open("/dev/null", os.O_RDONLY))
            client.connect(str(api.socket))  # into the backlog: the server cannot take it
            async with asyncio.timeout(10):
                while acceptor.accept_errors < 3:
                    await asyncio.sleep(0.01)
            for fd in fillers:
                os.close(fd)
        client.sendall(b"GET /v1/status HTTP/1.1\r\nHost: rdmad\r\nConnection: close\r\n\r\n")
        client.setblocking(False)
        async with asyncio.timeout(10):
            while chunk := await loop.sock_recv(client, 65536):
                answer += chunk
    client.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert len(_events(logs, "api.accept-paused")) == 1, _events(logs, "api.accept-paused")
    assert len(_events(logs, "api.accept-resumed")) == 1


# --- the bounds and the descriptor limit --------------------------------------------------------


def test_the_bounds_sit_well_below_the_units_descriptor_limit() -> None:
    """LimitNOFILE= in the unit leaves three quarters of the descriptors to the daemon's
    own work (/proc scans, netlink, modprobe); a lower limit shrinks the bounds."""
    unit = (REPO / "systemd/rdmad.service").read_text()
    [limit] = [int(v) for v in re.findall(r"^LimitNOFILE=(\d+)$", unit, re.M)]
    assert admission.fit(admission.API_LIMITS, limit) == admission.API_LIMITS
    assert admission.fit(admission.METRICS_LIMITS, limit) == admission.METRICS_LIMITS
    every = admission.API_LIMITS.most + admission.METRICS_LIMITS.most
    assert every * admission.FD_SHARE <= limit
    small = admission.fit(admission.API_LIMITS, 256)
    assert small.most + admission.fit(admission.METRICS_LIMITS, 256).most <= 256 // 4 + 2
    assert small.root_reserved >= 1 and small.per_uid is not None and small.per_uid >= 1


def test_root_takes_its_own_slots_first_then_shared_ones_and_users_their_share() -> None:
    slots = admission.Slots(admission.Limits(connections=3, per_uid=2, root_reserved=1))
    a = slots.take(1000)
    b = slots.take(1000)
    assert a is not None and b is not None and slots.take(1000) is None
    assert "uid 1000 has 2 connections open" in slots.why_not(1000)
    root = slots.take(0)
    assert root is not None and root.reserved
    other = slots.take(1001)
    assert other is not None and slots.take(1002) is None  # the shared ones are full
    slots.give_back(a)
    extra_root = slots.take(0)
    assert extra_root is not None and not extra_root.reserved
    assert slots.take(0) is None
    for s in (b, root, other, extra_root):
        slots.give_back(s)
    assert slots.open == 0 and not slots.by_uid
