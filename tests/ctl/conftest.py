"""rdmad-ctl against a stand-in for the daemon's API: a stdlib HTTP server on a UNIX
socket in a thread, answering each route with a fixture document (docs/API.md)
or with whatever broken answer a test needs."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from rdmad.ctl import run, unitstate
from rdmad.ctl.commands import Ctx

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
NOW = 1795000200.0  # the clock of every in-process run (fixture times are around it)
BOOT_ID = "0b3c6f3e-6a57-4b0e-9d2a-3c1c2f0d9a11"


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text()))


@dataclass
class Reply:
    status: int = 200  # 0: close the connection without answering
    body: bytes = b""
    content_type: str = "application/json"
    events: list[tuple[str, str]] | None = None  # server-sent events, then close
    # A stuck daemon: no answer until set (with events: the stream stays open after them)
    hold: threading.Event | None = None


@dataclass
class ApiStub:
    """The routes ("GET /v1/status") and what was asked (method, path with query)."""

    socket: str
    routes: dict[str, Reply] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)

    def json(self, route: str, doc: Any, status: int = 200) -> None:
        self.routes[route] = Reply(status, json.dumps(doc).encode())

    def fixture(self, route: str, name: str) -> dict[str, Any]:
        doc = fixture(name)
        self.json(route, doc)
        return doc

    def error(self, route: str, status: int, code: str, message: str) -> None:
        self.json(route, {"error": {"status": status, "code": code, "message": message}}, status)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    stub: ApiStub

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return  # the client hung up first: what several tests do on purpose
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked event streams, as aiohttp sends them
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a UNIX peer has no address for the default log line

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        stub = self.server.stub
        stub.requests.append((method, self.path))
        reply = stub.routes.get(f"{method} {self.path.split('?')[0]}")
        if reply is None:
            reply = Reply(404, b'{"error": {"status": 404, "code": "not-found", "message": "no"}}')
        if reply.hold is not None and reply.events is None:
            reply.hold.wait(30)
        if reply.status == 0:
            self.close_connection = True  # hang up without a word
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Connection", "close")
        if reply.events is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(b": keepalive\n\n")
        for event, data in reply.events:
            # Split each event across two chunks: the client must not rely on framing.
            raw = f"event: {event}\ndata: {data}\n\n".encode()
            self._chunk(raw[:7])
            self._chunk(raw[7:])
        if reply.hold is not None:
            reply.hold.wait(30)
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a UNIX socket path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ctl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api(short_dir: Path) -> Iterator[ApiStub]:
    stub = ApiStub(str(short_dir / "rdmad.sock"))
    server = _Server(stub.socket, _Handler)
    server.stub = stub
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield stub
    finally:
        for reply in stub.routes.values():
            if reply.hold is not None:
                reply.hold.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(autouse=True)
def no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """rdmad-ctl asks systemd about rdmad's unit when the daemon does not answer: here a
    systemctl that does not exist, as on a machine without systemd, whatever this one
    runs; a test that wants an answer puts its own (``fake_systemctl``)."""
    monkeypatch.setattr(unitstate, "SYSTEMCTL", "/nonexistent/systemctl")


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wall times print in UTC, whatever this machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@dataclass
class Result:
    code: int
    out: str
    err: str


def ctl(*argv: str, socket: str | None = None, state_dir: str | None = None) -> Result:
    """rdmad-ctl in this process, with the clock at NOW and no terminal."""
    out, err = io.StringIO(), io.StringIO()
    args = list(argv)
    if socket is not None:
        args = ["--socket", socket, *args]
    if state_dir is not None:
        args = ["--state-dir", state_dir, *args]
    code = run(args, Ctx(out, err, now=lambda: NOW, boot_id=lambda: BOOT_ID))
    return Result(code, out.getvalue(), err.getvalue())


def ctl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RDMAD_SOCKET", "NO_COLOR")}
    env["PYTHONPATH"] = str(REPO)
    return env


def ctl_process(*argv: str, **kwargs: Any) -> subprocess.Popen[str]:
    """rdmad-ctl as its own process (signals, the real entry point).

    A shell starts a background job with SIGINT ignored, and exec keeps it ignored:
    under `pytest ... &` rdmad-ctl would never see the Ctrl-C these tests send. A
    handled (not ignored) SIGINT here is SIG_DFL in the child, so its Python installs
    its Ctrl-C handler as under a terminal."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "rdmad.ctl", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ctl_env(),
            **kwargs,
        )
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
