"""rdmad-ctl against a socket whose listen backlog is full, on this machine's kernel.

Other local users' connections that rdmad has not yet accepted (a flood) fill the
socket's backlog; an AF_UNIX connect to a full backlog from a non-blocking socket fails
at once with EAGAIN. rdmad-ctl must wait, within its timeout, for rdmad's next accept,
and say plainly when the backlog stays full for all of it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from rdmad.ctl.client import Client, NoAnswer

ANSWER = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"api": 1}\n'
)


@pytest.fixture
def full_backlog(short_dir: Path) -> Iterator[tuple[socket.socket, str, int]]:
    """A listening socket that accepts nothing yet, its backlog filled by other clients."""
    path = str(short_dir / "full.sock")
    with ExitStack() as stack:
        server = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        server.bind(path)
        server.listen(1)
        waiting = 0
        for _ in range(64):  # the kernel takes backlog + 1 before it refuses
            other = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            other.setblocking(False)
            try:
                other.connect(path)
            except BlockingIOError:
                break
            waiting += 1
        else:
            pytest.fail("64 connections never filled a backlog of 1")
        yield server, path, waiting


def blocked_in_connect(tid: int) -> bool:
    """The thread sleeps in the kernel's wait for room in a listener's backlog."""
    try:
        return Path(f"/proc/self/task/{tid}/wchan").read_text() == "unix_wait_for_peer"
    except OSError:
        return False


def test_a_full_backlog_is_waited_out_until_rdmad_accepts(
    full_backlog: tuple[socket.socket, str, int],
) -> None:
    server, path, waiting = full_backlog
    outcome: dict[str, Any] = {}

    def status() -> None:
        outcome["tid"] = threading.get_native_id()
        try:
            outcome["answer"] = Client(path, 30.0).get("/v1/status")
        except Exception as exc:  # the assertion below says what it was
            outcome["error"] = exc

    client = threading.Thread(target=status)
    client.start()
    deadline = time.monotonic() + 10
    while not ("error" in outcome or ("tid" in outcome and blocked_in_connect(outcome["tid"]))):
        assert time.monotonic() < deadline, "the client neither waited nor failed in 10 s"
        time.sleep(0.005)
    assert "error" not in outcome, outcome  # before: EAGAIN at once, "cannot connect"
    accepted = [server.accept()[0] for _ in range(waiting + 1)]  # the others, then ours
    try:
        ours = accepted[-1]
        assert ours.recv(4096).startswith(b"GET /v1/status HTTP/1.1\r\n")
        ours.sendall(ANSWER)
        ours.close()
        client.join(10)
        assert not client.is_alive()
    finally:
        for conn in accepted:
            conn.close()
    assert outcome == {"tid": outcome["tid"], "answer": {"api": 1}}


def test_a_backlog_full_for_the_whole_timeout_is_said(
    full_backlog: tuple[socket.socket, str, int],
) -> None:
    _server, path, _waiting = full_backlog
    started = time.monotonic()
    with pytest.raises(NoAnswer) as failed:
        Client(path, 0.3).get("/v1/status")
    assert time.monotonic() - started >= 0.3  # it waited its timeout, not failed at once
    assert str(failed.value) == (
        f"rdmad did not accept a connection on {path} within 0.3 s "
        "(its backlog of waiting connections stayed full)"
    )
