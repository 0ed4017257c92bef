"""`rdmad-ctl watch`: a line per server-sent event, the end of the stream, and Ctrl-C
(a real SIGINT to a real process) ending it cleanly with exit 0."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from rdmad import exits
from tests.ctl.conftest import ApiStub, Reply, ctl, ctl_process

STATUS = {"summary": "2 object(s), 1 converged, 1 blocked", "converged": False,
          "counts": {"converged": 1, "blocked": 1}, "passes": 15}  # fmt: skip
HISTORY = {"at": 1795000150.0, "event": "failed", "obj": "sriov pci=0000:3b:00.0",
           "what": "sriov_numvfs: 4 -> 0", "reason": "declared 8 VFs", "cause": "sighup",
           "error": "Device or resource busy", "errno": 16}  # fmt: skip
EVENTS = [
    ("status", json.dumps(STATUS)),
    ("history", json.dumps(HISTORY)),
    ("status", json.dumps({**STATUS, "converged": True, "counts": {"converged": 2}, "passes": 16})),
]


def test_three_events_then_the_daemon_closes(api: ApiStub) -> None:
    api.routes["GET /v1/events"] = Reply(content_type="text/event-stream", events=EVENTS)
    result = ctl("watch", socket=api.socket)
    assert result.out.splitlines() == [
        "11:10:00 status   pass 15: NOT converged: 1 converged, 1 blocked",
        "11:09:10 failed sriov pci=0000:3b:00.0: sriov_numvfs: 4 -> 0  "
        "error: Device or resource busy [EBUSY (16)]; declared 8 VFs (cause: sighup)",
        "11:10:00 status   pass 16: converged: 2 converged",
    ]
    assert result.code == exits.FAIL
    assert "rdmad closed the event stream" in result.err


def test_watch_json_is_one_object_per_line(api: ApiStub) -> None:
    api.routes["GET /v1/events"] = Reply(content_type="text/event-stream", events=EVENTS)
    result = ctl("watch", "--json", socket=api.socket)
    *lines, last = [json.loads(line) for line in result.out.splitlines()]
    assert lines == [{"event": event, "data": json.loads(data)} for event, data in EVENTS]
    # The stream ended (exit 1): the last line is the JSON error object saying so.
    assert result.code == exits.FAIL
    assert (
        last["error"]["code"] == "failed" and "closed the event stream" in last["error"]["message"]
    )


def test_refused_event_stream(api: ApiStub) -> None:
    api.error("GET /v1/events", 503, "unavailable", "64 event streams already")
    result = ctl("watch", socket=api.socket)
    assert result.code == exits.FAIL
    assert "64 event streams already" in result.err


def _line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from rdmad-ctl within {timeout} s"
    return proc.stdout.readline()


def test_ctrl_c_ends_watch_with_exit_0_and_no_traceback(api: ApiStub) -> None:
    hold = threading.Event()
    api.routes["GET /v1/events"] = Reply(
        content_type="text/event-stream", events=EVENTS[:1], hold=hold
    )
    proc = ctl_process("--socket", api.socket, "watch")
    try:
        assert "pass 15: NOT converged" in _line(proc)  # connected and waiting for more
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        hold.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert (out, err) == ("", "")


def test_ctrl_c_while_waiting_for_an_answer_exits_130_quietly(api: ApiStub) -> None:
    hold = threading.Event()
    api.routes["POST /v1/reconcile"] = Reply(200, b"{}", hold=hold)
    proc = ctl_process("--socket", api.socket, "reconcile")
    try:
        _wait_for(lambda: ("POST", "/v1/reconcile?wait=30") in api.requests)  # in flight
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        hold.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == exits.INTERRUPTED
    assert err == ""


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        threading.Event().wait(0.02)
