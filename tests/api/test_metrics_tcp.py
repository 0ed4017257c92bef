"""The optional TCP listener: GET /metrics on exactly the configured address, JSON errors
for everything else, closed cleanly; and the daemon starting it (and the textfile) from
its config, even when the rest of the config is invalid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from rdmad.api.metrics import CONTENT_TYPE, Metrics
from rdmad.api.metrics_http import ListenError, MetricsListener, parse_listen, start_tcp_listener
from rdmad.status import HistoryEntry, StatusSnapshot, StatusStore
from rdmad.triggers import Trigger, TriggerQueue
from tests.agent.test_daemon_process import Systemd
from tests.api.metricsutil import parse, value
from tests.support.fakeclock import FakeClock
from tests.support.procs import reap

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:9478", ("127.0.0.1", 9478)),
        ("[::1]:9478", ("::1", 9478)),
        ("[::]:0", ("::", 0)),
        ("localhost:9100", ("localhost", 9100)),
    ],
)
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("9478", "host:port"),
        ("127.0.0.1:", "host:port"),
        (":9478", "host:port"),
        ("127.0.0.1:http", "host:port"),
        ("127.0.0.1:70000", "out of range"),
        ("::1:9478", "in brackets"),
        ("[nothost]:9478", "not an IPv6 address"),
    ],
)
def test_parse_listen_refuses(text: str, why: str) -> None:
    with pytest.raises(ListenError, match=why):
        parse_listen(text)


@pytest.fixture
async def served() -> AsyncIterator[tuple[MetricsListener, StatusStore, TriggerQueue, str]]:
    store = StatusStore()
    queue = TriggerQueue(FakeClock())
    metrics = Metrics(store, queue)
    listener = await start_tcp_listener(metrics, "127.0.0.1:0")
    [(host, port)] = listener.addresses
    assert host == "127.0.0.1"  # exactly what was asked, not every address
    try:
        yield listener, store, queue, f"http://127.0.0.1:{port}"
    finally:
        await listener.close()
        metrics.close()


async def test_get_metrics(
    served: tuple[MetricsListener, StatusStore, TriggerQueue, str],
) -> None:
    _, store, queue, base = served
    store.publish(StatusSnapshot(passes=3, last_pass_at=10.0, last_pass_seconds=0.01))
    store.record([HistoryEntry(1.0, "applied", kind="set-vf")])
    queue.put(Trigger("netlink"))
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE
        got = parse(await resp.text())
    assert value(got, "rdmad_reconcile_passes_total") == 3
    assert value(got, "rdmad_actions_total", kind="set-vf", outcome="applied") == 1
    assert value(got, "rdmad_events_total", source="netlink") == 1
    assert value(got, "rdmad_up") == 1


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/", 404, "not-found"),
        ("GET", "/v1/status", 404, "not-found"),
        ("GET", "/metrics/x", 404, "not-found"),
        ("POST", "/metrics", 405, "method-not-allowed"),
        ("DELETE", "/metrics", 405, "method-not-allowed"),
    ],
)
async def test_everything_else_is_a_json_error(
    served: tuple[MetricsListener, StatusStore, TriggerQueue, str],
    method: str,
    path: str,
    status: int,
    code: str,
) -> None:
    base = served[3]
    async with aiohttp.ClientSession() as http, http.request(method, base + path) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert body["error"]["status"] == status
    assert body["error"]["code"] == code
    assert path in body["error"]["message"]


async def test_closed_cleanly_frees_the_port() -> None:
    metrics = Metrics(StatusStore())
    listener = await start_tcp_listener(metrics, "127.0.0.1:0")
    [(_, port)] = listener.addresses
    await listener.close()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http:
            await http.get(f"http://127.0.0.1:{port}/metrics")
    # The same address can be bound again at once.
    again = await start_tcp_listener(metrics, f"127.0.0.1:{port}")
    assert again.addresses == [("127.0.0.1", port)]
    await again.close()


async def test_an_address_in_use_raises_oserror() -> None:
    metrics = Metrics(StatusStore())
    first = await start_tcp_listener(metrics, "127.0.0.1:0")
    [(_, port)] = first.addresses
    try:
        with pytest.raises(OSError):
            await start_tcp_listener(metrics, f"127.0.0.1:{port}")
    finally:
        await first.close()


# --- the daemon wires it ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_daemon_serves_metrics_and_writes_the_textfile_with_an_invalid_config(
    tmp_path: Path, short_dir: Path
) -> None:
    cfg = tmp_path / "etc"
    (cfg / "rdmad.d").mkdir(parents=True)
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    port = free_port()
    (cfg / "rdmad.toml").write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{port}"\ntextfile_dir = "{textdir}"\n'
        # Its own API socket: never the host's /run/rdmad.
        f'[api]\nsocket = "{short_dir / "rdmad.sock"}"\n'
    )
    # Invalid elsewhere: the daemon runs on with nothing managed, metrics stay on.
    (cfg / "rdmad.d" / "50-bad.toml").write_text("[daemon]\nsettle = 'soon'\n")
    sd = Systemd(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
    env.pop("WATCHDOG_USEC", None)
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmad.cli", "run", "--config", str(cfg), "--log-format", "json"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = textdir / "rdmad.prom"
    try:
        assert "config invalid" in sd.expect("READY=1")
        status, text = fetch(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        got = parse(text)
        assert value(got, "rdmad_ready") == 1
        assert value(got, "rdmad_config_valid") == 0
        assert (value(got, "rdmad_reconcile_passes_total") or 0) >= 1
        assert value(got, "rdmad_events_total", source="startup") == 1
        status, text = fetch(f"http://127.0.0.1:{port}/v1/status")
        assert status == 404 and json.loads(text)["error"]["code"] == "not-found"

        # Written at start, then again (debounced) once the first pass is published.
        deadline = time.monotonic() + 10
        while not (prom.exists() and value(parse(prom.read_text()), "rdmad_ready") == 1):
            assert time.monotonic() < deadline, "textfile never showed rdmad ready"
            time.sleep(0.02)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
        log.close()
        sd.sock.close()
    assert value(parse(prom.read_text()), "rdmad_up") == 0  # the last write: stopped
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
