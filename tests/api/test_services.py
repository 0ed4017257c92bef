"""The API and metrics started once the first pass rests (rdmad.services): READY=1 waits
for the API socket, the import for the first rest (bounded), metrics count what
happened before they existed, and a service that fails or is late never keeps READY=1
back for good."""

from __future__ import annotations

import asyncio
import gc
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import structlog

from rdmad import daemon, services
from rdmad.config import start_settings
from rdmad.status import HistoryEntry, StatusSnapshot, StatusStore
from rdmad.triggers import TriggerQueue
from tests.api.metricsutil import parse, series, value
from tests.support.fakeclock import FakeClock


class Systemd:
    """The notifier behind the gate; notes whether the API socket existed at READY=1."""

    def __init__(self, socket: Path | None = None) -> None:
        self.socket = socket
        self.sent: list[str] = []
        self.socket_at_ready: bool | None = None

    def notify(self, state: str) -> None:
        self.sent.append(state)
        if "READY=1" in state.split("\n") and self.socket is not None:
            self.socket_at_ready = self.socket.exists()


@pytest.fixture(autouse=True)
def _unfreeze() -> object:
    """start_services freezes the heap it finds (gc.freeze); the test process's is given back."""
    yield
    gc.unfreeze()


def start(location: Path, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, services.Services]:
    """``start_services`` as the daemon calls it: with the settings it read at start."""
    return services.start_services(location, start_settings(location), *args, **kwargs)


def config(tmp_path: Path, socket: Path) -> Path:
    (tmp_path / "rdmad.toml").write_text(f'[api]\nsocket = "{socket}"\n')
    return tmp_path


def test_the_gate_holds_ready_and_passes_everything_else() -> None:
    sd = Systemd()
    gate = services.ReadyGate(sd)
    gate.notify("WATCHDOG=1")
    gate.notify("READY=1\nSTATUS=2 objects converged")
    assert sd.sent == ["WATCHDOG=1", "STATUS=2 objects converged"]
    gate.open()
    assert sd.sent[-1] == "READY=1\nSTATUS=2 objects converged"
    gate.open()  # twice: nothing sent twice
    gate.notify("RELOADING=1")
    gate.notify("READY=1\nSTATUS=x")  # open: straight through
    assert sd.sent[-3:] == [
        "READY=1\nSTATUS=2 objects converged",
        "RELOADING=1",
        "READY=1\nSTATUS=x",
    ]


@pytest.mark.parametrize("before", [None, "/etc/ssl/certs/ca-certificates.crt"])
def test_no_ca_bundle_gives_contexts_without_certificates_and_restores_the_environment(
    before: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if before is None:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    else:
        monkeypatch.setenv("SSL_CERT_FILE", before)
    with services.no_ca_bundle():
        assert os.environ["SSL_CERT_FILE"] == os.devnull
        inside = ssl.create_default_context().cert_store_stats()
    assert inside["x509_ca"] == 0  # OpenSSL read the empty file, not the system's bundle
    assert os.environ.get("SSL_CERT_FILE") == before


def test_importing_the_services_leaves_the_environment_as_it_was() -> None:
    """In a new interpreter, where the import really runs (aiohttp, prometheus_client)."""
    script = (
        "import os, rdmad.services as s; s.import_services(); "
        "import sys; print('aiohttp' in sys.modules, os.environ.get('SSL_CERT_FILE'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "None"]


async def test_ready_goes_out_once_the_api_socket_listens_before_the_import(
    tmp_path: Path, short_dir: Path
) -> None:
    """READY=1 waits for the socket, not for aiohttp: a client that connects while the
    import runs waits in the backlog and is answered once the server starts."""
    socket = short_dir / "rdmad.sock"
    sd = Systemd(socket)
    gate = services.ReadyGate(sd)
    store = StatusStore()
    release = threading.Event()

    def slow_import() -> float:  # the import thread, still busy when the pass is done
        if not release.wait(30):
            raise TimeoutError("never released")
        return services.import_services()

    gate.notify("READY=1\nSTATUS=nothing declared")  # the agent's first pass is done
    assert not any("READY=1" in s for s in sd.sent)  # held: no socket yet
    early = services.EarlyChanges(store)
    starting = asyncio.create_task(
        start(
            config(tmp_path, socket),
            store,
            TriggerQueue(FakeClock()),
            early,
            gate,
            importer=slow_import,
        )
    )
    for _ in range(100):  # bounded: the task's first step makes the socket
        if sd.sent and sd.sent[-1].startswith("READY=1"):
            break
        await asyncio.sleep(0.01)
    assert sd.sent[-1] == "READY=1\nSTATUS=nothing declared"
    assert sd.socket_at_ready is True and not starting.done()  # the import still runs
    answer = asyncio.create_task(asyncio.to_thread(_get_status, socket))
    await asyncio.sleep(0.05)
    assert not answer.done()  # connected, waiting in the backlog
    release.set()
    started = await asyncio.wait_for(starting, 30)
    try:
        assert started.api is not None and started.metrics is not None
        assert (await asyncio.wait_for(answer, 30)).startswith("HTTP/1.1 200")
    finally:
        await started.close()
    assert not socket.exists()


async def test_the_import_waits_for_the_first_rest(tmp_path: Path, short_dir: Path) -> None:
    """The socket listens at once; the import starts only at the agent's first READY=1
    (it would share the GIL with the pass's Python)."""
    socket = short_dir / "rdmad.sock"
    sd = Systemd(socket)
    gate = services.ReadyGate(sd)
    imported = threading.Event()

    def importer() -> float:
        imported.set()
        return services.import_services()

    store = StatusStore()
    starting = asyncio.create_task(
        start(
            config(tmp_path, socket), store, TriggerQueue(FakeClock()),
            services.EarlyChanges(store), gate, importer=importer, wait=30,
        )
    )  # fmt: skip
    for _ in range(100):  # bounded: the task's first step makes the socket
        if socket.exists():
            break
        await asyncio.sleep(0.01)
    assert socket.exists() and gate.is_open
    # Passes without a rest: STATUS lines only, as the agent sends while it works.
    for _ in range(20):
        gate.notify("STATUS=creating 4 VFs on 0000:01:00.0")
        await asyncio.sleep(0.01)
    assert not imported.is_set() and not starting.done()
    gate.notify("READY=1\nSTATUS=converged")
    started = await asyncio.wait_for(starting, 30)
    try:
        assert imported.is_set() and started.api is not None
        assert sd.sent[-1] == "READY=1\nSTATUS=converged" and sd.socket_at_ready is True
    finally:
        await started.close()


async def test_a_first_pass_that_does_not_rest_in_time_lets_the_import_start(
    tmp_path: Path, short_dir: Path
) -> None:
    """A pass that waits long on the kernel (a large NIC's numvfs write) does not keep the
    API away: the import starts after ``wait`` s, and says so."""
    socket = short_dir / "rdmad.sock"
    gate = services.ReadyGate(Systemd(socket))
    store = StatusStore()
    starting = start(
        config(tmp_path, socket), store, TriggerQueue(FakeClock()),
        services.EarlyChanges(store), gate, wait=0.05,
    )  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        started = await asyncio.wait_for(starting, 30)
    try:
        assert started.api is not None and not gate.rested.is_set()
        assert (await asyncio.to_thread(_get_status, socket)).startswith("HTTP/1.1 200")
    finally:
        await started.close()
    events = [e["event"] for e in logs]
    assert events.index("services.not-waiting") < events.index("services.started")


def _get_status(socket: Path) -> str:
    """GET /v1/status over the socket as root; the answer's status line."""
    import socket as sockets

    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(socket))
        sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: rdmad\r\nConnection: close\r\n\r\n")
        return sock.recv(4096).decode("latin-1").split("\r\n", 1)[0]


async def test_services_that_cannot_start_remove_the_socket(
    tmp_path: Path, short_dir: Path
) -> None:
    """A socket nobody will serve is removed: a client is refused, not left waiting."""
    socket = short_dir / "rdmad.sock"
    sd = Systemd(socket)
    gate = services.ReadyGate(sd)
    gate.notify("READY=1")

    def broken() -> float:
        assert socket.exists()  # made before the import
        raise ImportError("No module named 'aiohttp'")

    store = StatusStore()
    with structlog.testing.capture_logs():
        started = await start(
            config(tmp_path, socket), store, TriggerQueue(FakeClock()),
            services.EarlyChanges(store), gate, importer=broken,
        )  # fmt: skip
    assert sd.sent == ["READY=1"] and sd.socket_at_ready is True
    assert started.api is None and not socket.exists()


async def test_the_heap_is_frozen_once_the_services_are_imported_and_started(
    tmp_path: Path,
) -> None:
    """What the API's and metrics' imports made is out of every later collection: frozen
    after the import and the start, not before (daemon.freeze_startup_heap)."""
    steps: list[str] = []

    def importer() -> float:
        steps.append("import")
        return services.import_services()

    (tmp_path / "rdmad.toml").write_text("[api]\nenabled = false\n")
    store = StatusStore()
    gate = services.ReadyGate(Systemd())
    gate.notify("READY=1")  # the first pass rested
    started = await start(
        tmp_path, store, TriggerQueue(FakeClock()), services.EarlyChanges(store),
        gate, importer=importer,
        freeze=lambda: steps.append(f"freeze metrics={started_metrics() is not None}"),
    )  # fmt: skip
    await started.close()
    assert steps == ["import", "freeze metrics=True"]


def started_metrics() -> object:
    """The Metrics class, once rdmad.api.metrics is imported (None before)."""
    module = sys.modules.get("rdmad.api.metrics")
    return getattr(module, "Metrics", None)


def test_the_daemon_freezes_what_its_imports_made() -> None:
    """In a fresh interpreter: after freeze_startup_heap, the objects the daemon's imports
    made (tens of thousands) are in the permanent generation, which no collection walks."""
    code = (
        "import gc, rdmad.daemon as d; before = gc.get_freeze_count(); "
        "d.freeze_startup_heap(); print(before == 0, gc.get_freeze_count() > 10000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


async def test_metrics_count_the_passes_and_actions_before_them(tmp_path: Path) -> None:
    store = StatusStore()
    early = services.EarlyChanges(store)
    store.publish(StatusSnapshot(passes=1, last_pass_at=100.0, last_pass_seconds=0.25))
    store.record([HistoryEntry(100.0, "applied", obj="a", kind="set-numvfs")])
    store.publish(StatusSnapshot(passes=2, last_pass_at=101.0, last_pass_seconds=0.002))
    (tmp_path / "rdmad.toml").write_text("[api]\nenabled = false\n")
    gate = services.ReadyGate(Systemd())
    gate.notify("READY=1")  # the first pass rested
    started = await start(tmp_path, store, TriggerQueue(FakeClock()), early, gate)
    assert started.metrics is not None and started.api is None
    store.publish(StatusSnapshot(passes=3, last_pass_at=102.0, last_pass_seconds=0.004))
    got = parse(started.metrics.render())
    assert value(got, "rdmad_reconcile_passes_total") == 3
    assert value(got, "rdmad_reconcile_duration_seconds_count") == 3  # each with its duration
    assert value(got, "rdmad_reconcile_duration_seconds_sum") == 0.256
    assert series(got, "rdmad_actions_total") == {
        frozenset({("kind", "set-numvfs"), ("outcome", "applied")}): 1
    }
    assert not early.changes  # handed over, and no longer listening
    await started.close()


async def test_a_service_that_fails_to_import_still_lets_ready_out(tmp_path: Path) -> None:
    sd = Systemd()
    gate = services.ReadyGate(sd)
    gate.notify("READY=1")

    def broken() -> float:
        raise ImportError("No module named 'aiohttp'")

    store = StatusStore()
    with structlog.testing.capture_logs() as logs:
        started = await start(
            tmp_path, store, TriggerQueue(FakeClock()), services.EarlyChanges(store), gate,
            importer=broken,
        )  # fmt: skip
    assert sd.sent == ["READY=1"]
    assert started.api is None and started.metrics is None
    assert any(e["event"] == "services.failed" and "aiohttp" in e["error"] for e in logs)


async def test_services_that_are_late_let_ready_out_at_their_deadline(tmp_path: Path) -> None:
    sd = Systemd()
    gate = services.ReadyGate(sd)
    gate.notify("READY=1")
    hang = threading.Event()
    store = StatusStore()
    with structlog.testing.capture_logs() as logs:
        started = await start(
            tmp_path, store, TriggerQueue(FakeClock()), services.EarlyChanges(store), gate,
            importer=lambda: float(hang.wait(30)), deadline=0.05,
        )  # fmt: skip
    hang.set()  # let the worker thread end
    assert sd.sent == ["READY=1"] and started.api is None
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["services.late"]


async def test_a_stop_during_start_up_closes_nothing_half_started() -> None:
    never = asyncio.get_running_loop().create_future()

    async def starting() -> services.Services:
        await never
        raise AssertionError("not reached")

    task = asyncio.create_task(starting())
    await asyncio.sleep(0)
    got = await daemon._stop_starting(task)
    assert task.cancelled() and got.api is None and got.metrics is None
