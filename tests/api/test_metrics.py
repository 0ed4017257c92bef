"""Metrics over the status store and trigger queue: counters follow passes and history,
gauges follow the current snapshot, values read back as Prometheus parses them."""

from __future__ import annotations

import asyncio
import errno
import os
import platform
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from rdmad import __version__
from rdmad.agent import Agent, AgentOptions
from rdmad.api.metrics import CONTENT_TYPE, Metrics, errno_name
from rdmad.api.textfile import TextfileWriter
from rdmad.model import AttrStatus, ObjectDetail, ObjectState, VfStatus
from rdmad.state import StateStore
from rdmad.status import HistoryEntry, ObjectReport, StatusSnapshot, StatusStore
from rdmad.triggers import Trigger, TriggerQueue
from tests.agent.conftest import ConfigBox, FakeHost, Notes, desired, until
from tests.api.metricsutil import Samples, parse, series, value, wait_for
from tests.support.fakeclock import FakeClock

C, P, B, D = (ObjectState.CONVERGED, ObjectState.PENDING, ObjectState.BLOCKED,
              ObjectState.DEGRADED)  # fmt: skip
U = ObjectState.UNSUPPORTED
PF = "pci=0000:00:03.0"


def scrape(m: Metrics) -> Samples:
    return parse(m.render())


def sriov_detail(pf: str, numvfs: int | None, present: int | None) -> ObjectDetail:
    """A PF with VF 0 converged with an unsupported attribute, VF 1 blocked while
    in use, VF 2 blocked but free (not an in-use block), VF 3 blocked with an unknown
    user (counts as in use)."""
    observed: dict[str, Any] = {"pci": "0000:00:03.0"}
    if present is not None:
        observed["numvfs"] = present
    return ObjectDetail(
        kind="sriov",
        desired={"pf": pf, "numvfs": numvfs},
        observed=observed,
        attributes=(AttrStatus("numvfs", numvfs, present, B),),
        vfs=(
            VfStatus(0, "0000:00:04.0", "eth5", "igbvf", U, attributes=(
                AttrStatus("mac", "02:00:00:00:00:01", "02:00:00:00:00:01", C),
                AttrStatus("query_rss", True, None, U),
            )),
            VfStatus(1, "0000:00:04.1", None, "vfio-pci", B, usage="in-use",
                     holders=("pid 1234 (qemu) holds /dev/vfio/42",)),
            VfStatus(2, "0000:00:04.2", None, "vfio-pci", B, usage="free"),
            VfStatus(3, "0000:00:04.3", None, None, B, usage="unknown"),
        ),
    )  # fmt: skip


def snapshot(passes: int, *objects: ObjectReport, **kw: Any) -> StatusSnapshot:
    kw.setdefault("last_pass_at", 1_795_000_000.0 + passes)
    kw.setdefault("last_pass_seconds", 0.003)
    return StatusSnapshot(objects=objects, passes=passes, **kw)


@pytest.fixture
def store() -> StatusStore:
    return StatusStore()


@pytest.fixture
def queue() -> TriggerQueue:
    return TriggerQueue(FakeClock())


def test_gauges_follow_the_current_snapshot(store: StatusStore, queue: TriggerQueue) -> None:
    m = Metrics(store, queue, started_at=1_794_999_000.0)
    store.publish(
        snapshot(
            1,
            ObjectReport("sriov pci=0000:00:03.0", B, detail=sriov_detail(PF, 2, 4)),
            ObjectReport("sriov name=ens2", P, detail=sriov_detail("name=ens2", 8, None)),
            ObjectReport("rxe rxe0", C),  # no detail yet: in the state count only
            ObjectReport(
                "rxe rxe1",
                B,
                detail=ObjectDetail("rxe", {"name": "rxe1"}, {"name": "rxe1", "usage": "in-use"}),
            ),
            ready=True,
            config_errors=("/etc/rdmad/rdmad.toml: daemon.settle: bad",),
        )
    )
    got = scrape(m)
    assert series(got, "rdmad_objects") == {
        frozenset({("state", s.value)}): n
        for s, n in {C: 1, P: 1, B: 2, D: 0, U: 0, ObjectState.DRIFT_IN_USE: 0}.items()
    }
    # The PF label is the PF as declared; no observed numvfs (PF not there): no sample.
    assert series(got, "rdmad_vfs_desired") == {
        frozenset({("pf", "pci=0000:00:03.0")}): 2,
        frozenset({("pf", "name=ens2")}): 8,
    }
    assert series(got, "rdmad_vfs_present") == {frozenset({("pf", "pci=0000:00:03.0")}): 4}
    # Two sriov objects each: one VF attribute (query_rss) unsupported.
    assert value(got, "rdmad_attributes_unsupported") == 2
    # Per sriov object VF 1 (in-use) and VF 3 (unknown = in use); VF 2 is free. The
    # rxe link is blocked as a whole while in use.
    assert value(got, "rdmad_in_use_blocks") == 2 + 2 + 1
    assert value(got, "rdmad_ready") == 1
    assert value(got, "rdmad_config_valid") == 0
    assert value(got, "rdmad_up") == 1
    assert value(got, "rdmad_start_time_seconds") == 1_794_999_000.0
    assert (
        value(got, "rdmad_build_info", version=__version__, python=platform.python_version()) == 1
    )

    store.publish(snapshot(2, ObjectReport("rxe rxe0", C)))
    got = scrape(m)
    assert value(got, "rdmad_objects", state="blocked") == 0
    assert value(got, "rdmad_objects", state="converged") == 1
    assert series(got, "rdmad_vfs_desired") == {}
    assert value(got, "rdmad_in_use_blocks") == 0
    assert value(got, "rdmad_ready") == 0
    assert value(got, "rdmad_config_valid") == 1


def test_vf_counts_per_pf(store: StatusStore) -> None:
    m = Metrics(store)
    a = ObjectDetail("sriov", {"pf": "pci=0000:00:03.0", "numvfs": 4}, {"numvfs": 2})
    b = ObjectDetail("sriov", {"pf": "name=ens2", "numvfs": 0}, {"numvfs": 7})
    store.publish(snapshot(1, ObjectReport("a", P, detail=a), ObjectReport("b", P, detail=b)))
    got = scrape(m)
    assert series(got, "rdmad_vfs_desired") == {
        frozenset({("pf", "pci=0000:00:03.0")}): 4,
        frozenset({("pf", "name=ens2")}): 0,
    }
    assert series(got, "rdmad_vfs_present") == {
        frozenset({("pf", "pci=0000:00:03.0")}): 2,
        frozenset({("pf", "name=ens2")}): 7,
    }


def test_passes_and_duration_count_only_new_passes(store: StatusStore) -> None:
    m = Metrics(store)
    got = scrape(m)
    assert value(got, "rdmad_reconcile_passes_total") == 0
    assert value(got, "rdmad_reconcile_duration_seconds_count") == 0
    assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") is None

    store.publish(snapshot(1, ObjectReport("x", C), last_pass_seconds=0.003))
    store.publish(snapshot(1, ObjectReport("x", C), ready=True))  # republished: no pass
    store.publish(snapshot(2, ObjectReport("x", C), last_pass_seconds=7.0))
    got = scrape(m)
    assert value(got, "rdmad_reconcile_passes_total") == 2
    assert value(got, "rdmad_reconcile_duration_seconds_count") == 2
    assert value(got, "rdmad_reconcile_duration_seconds_sum") == pytest.approx(7.003)
    bucket = "rdmad_reconcile_duration_seconds_bucket"
    assert value(got, bucket, le="0.001") == 0
    assert value(got, bucket, le="0.005") == 1
    assert value(got, bucket, le="5.0") == 1
    assert value(got, bucket, le="10.0") == 2
    assert value(got, bucket, le="60.0") == 2
    assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") == 1_795_000_002.0


def test_last_success_skips_degraded_and_failed_observations(store: StatusStore) -> None:
    m = Metrics(store)
    store.publish(snapshot(1, ObjectReport("x", C), last_pass_at=100.0))
    store.publish(snapshot(2, ObjectReport("x", D), last_pass_at=200.0))
    store.publish(snapshot(3, ObjectReport("x", C), last_pass_at=300.0, last_pass_ok=False))
    got = scrape(m)
    assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") == 100.0
    assert value(got, "rdmad_reconcile_passes_total") == 3
    # Blocked is not a failure: rdmad did its job and said why it held back.
    store.publish(snapshot(4, ObjectReport("x", B), last_pass_at=400.0))
    assert value(scrape(m), "rdmad_last_successful_reconcile_timestamp_seconds") == 400.0


def test_actions_and_kernel_errors_from_history(store: StatusStore) -> None:
    m = Metrics(store)
    store.record(
        [
            HistoryEntry(1.0, "start"),
            HistoryEntry(2.0, "applied", obj="a", kind="set-numvfs"),
            HistoryEntry(3.0, "applied", obj="a", kind="set-numvfs"),
            HistoryEntry(4.0, "failed", obj="a", kind="set-vf", errno=errno.EINVAL),
            HistoryEntry(5.0, "failed", obj="a", kind="set-vf", errno=errno.EOPNOTSUPP),
            HistoryEntry(6.0, "failed", obj="a", kind="add-rxe", errno=errno.EINVAL),
            HistoryEntry(7.0, "failed", obj="a", kind="add-rxe", error="timed out"),
            HistoryEntry(8.0, "recorded", obj="a", kind="add-rxe"),
            HistoryEntry(9.0, "stale", obj="a", kind="delete-rxe"),
            HistoryEntry(10.0, "recovered", obj="a"),
            HistoryEntry(11.0, "config-invalid", error="x"),
        ]
    )
    got = scrape(m)
    assert series(got, "rdmad_actions_total") == {
        frozenset({("kind", k), ("outcome", o)}): n
        for (k, o), n in {
            ("set-numvfs", "applied"): 2,
            ("set-vf", "failed"): 2,
            ("add-rxe", "failed"): 2,
            ("add-rxe", "recorded"): 1,
            ("delete-rxe", "stale"): 1,
        }.items()
    }
    assert series(got, "rdmad_kernel_errors_total") == {
        frozenset({("errno", "EINVAL")}): 2,
        frozenset({("errno", "EOPNOTSUPP")}): 1,
    }
    assert errno_name(99999) == "99999"


def test_events_by_source_read_from_the_queue_at_scrape_time(
    store: StatusStore, queue: TriggerQueue
) -> None:
    m = Metrics(store, queue)
    assert series(scrape(m), "rdmad_events_total") == {}
    for source in ("udev", "udev", "netlink", "api"):
        queue.put(Trigger(source))
    queue.take()  # taken by the agent: still counted
    queue.put(Trigger("udev"))
    assert series(scrape(m), "rdmad_events_total") == {
        frozenset({("source", "udev")}): 3,
        frozenset({("source", "netlink")}): 1,
        frozenset({("source", "api")}): 1,
    }


def test_built_after_passes_counts_them_without_durations(store: StatusStore) -> None:
    store.publish(snapshot(5, ObjectReport("x", C), last_pass_at=50.0))
    m = Metrics(store)
    store.publish(snapshot(6, ObjectReport("x", C), last_pass_at=60.0, last_pass_seconds=0.02))
    got = scrape(m)
    assert value(got, "rdmad_reconcile_passes_total") == 6
    assert value(got, "rdmad_reconcile_duration_seconds_count") == 1
    assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") == 60.0


def test_a_listener_that_raises_is_dropped_and_metrics_go_on(store: StatusStore) -> None:
    calls: list[str] = []

    def broken(change: tuple[str, Any]) -> None:
        calls.append(change[0])
        raise RuntimeError("listener bug")

    store.subscribe(broken)
    m = Metrics(store)
    with capture_logs() as logs:
        store.publish(snapshot(1, ObjectReport("x", C)))
    store.publish(snapshot(2, ObjectReport("x", C)))
    store.record([HistoryEntry(1.0, "applied", kind="add-rxe")])
    assert calls == ["status"]  # dropped after its first failure
    assert store.current.passes == 2
    assert [e["event"] for e in logs] == ["status.listener-failed"]
    got = scrape(m)
    assert value(got, "rdmad_reconcile_passes_total") == 2
    assert value(got, "rdmad_actions_total", kind="add-rxe", outcome="applied") == 1


def test_render_is_the_text_format_and_close_marks_down(store: StatusStore) -> None:
    m = Metrics(store)
    assert CONTENT_TYPE.startswith("text/plain")
    text = m.render().decode()
    assert "# TYPE rdmad_reconcile_passes_total counter" in text
    assert "_created" not in text  # no created-timestamp series beside the counters
    m.close()
    assert value(scrape(m), "rdmad_up") == 0
    store.publish(snapshot(1, ObjectReport("x", C)))
    assert value(scrape(m), "rdmad_reconcile_passes_total") == 0  # no longer listening


# --- over the real agent --------------------------------------------------------------------


def make_agent(tmp_path: Path, host: FakeHost, queue: TriggerQueue, clock: FakeClock) -> Agent:
    return Agent(
        host,
        ConfigBox(desired(("rxe0", "eth0"), ("rxe1", "eth1"))),
        clock=clock,
        queue=queue,
        notifier=Notes(),
        state_store=StateStore(tmp_path / "state"),
        boot_id="boot-1",
        options=AgentOptions(backoff_jitter=0.0, drift_jitter=0.0),
        rng=lambda: 0.5,
    )


async def run_agent(agent: Agent) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(agent.run())
    await until(lambda: agent.status.current.passes >= 1, "first pass")
    return task


async def stop_agent(agent: Agent, task: asyncio.Task[None]) -> None:
    agent.stop()
    await asyncio.wait_for(task, 5)


async def settle(agent: Agent, clock: FakeClock) -> None:
    for _ in range(20):
        clock.advance(agent.options.settle_max + 0.01)
        for _ in range(50):
            await asyncio.sleep(0)


async def test_metrics_follow_a_real_agent(tmp_path: Path) -> None:
    clock = FakeClock()
    queue = TriggerQueue(clock)
    host = FakeHost(fail={"rxe1": errno.EINVAL})
    agent = make_agent(tmp_path, host, queue, clock)
    m = Metrics(agent.status, queue)
    task = await run_agent(agent)
    try:
        await settle(agent, clock)
        snap = agent.status.current
        got = scrape(m)
        assert value(got, "rdmad_reconcile_passes_total") == snap.passes
        assert value(got, "rdmad_reconcile_duration_seconds_count") == snap.passes
        assert value(got, "rdmad_objects", state="converged") == 1
        assert value(got, "rdmad_objects", state="degraded") == 1
        assert value(got, "rdmad_actions_total", kind="add-rxe", outcome="applied") == 1
        failed = [e for e in agent.status.history() if e.event == "failed"]
        assert failed and all(e.errno == errno.EINVAL for e in failed)
        assert value(got, "rdmad_actions_total", kind="add-rxe", outcome="failed") == len(failed)
        assert value(got, "rdmad_kernel_errors_total", errno="EINVAL") == len(failed)
        assert value(got, "rdmad_events_total", source="startup") == 1
        assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") is None

        del host.fail["rxe1"]  # the retry succeeds
        for _ in range(10):  # past the backoff, bounded
            if agent.status.current.count(D) == 0:
                break
            clock.advance(60)
            await settle(agent, clock)
        snap = agent.status.current
        assert snap.count(D) == 0 and snap.last_pass_at is not None
        got = scrape(m)
        assert value(got, "rdmad_objects", state="converged") == 2
        assert value(got, "rdmad_actions_total", kind="add-rxe", outcome="applied") == 2
        assert value(got, "rdmad_events_total", source="retry") is not None
        assert value(got, "rdmad_reconcile_passes_total") == snap.passes
        assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") == snap.last_pass_at
    finally:
        await stop_agent(agent, task)
        m.close()


async def test_a_failed_observation_is_no_successful_reconcile(tmp_path: Path) -> None:
    clock = FakeClock()
    queue = TriggerQueue(clock)
    host = FakeHost()
    agent = make_agent(tmp_path, host, queue, clock)
    m = Metrics(agent.status, queue)
    task = await run_agent(agent)
    try:
        await settle(agent, clock)
        good = agent.status.current
        assert good.last_pass_ok and good.last_pass_at is not None
        assert value(scrape(m), "rdmad_last_successful_reconcile_timestamp_seconds") == (
            good.last_pass_at
        )

        def broken() -> None:
            raise OSError("netlink gone")

        host.on_observe = broken
        clock.advance(1.0)
        queue.put(Trigger("udev"))
        await until(lambda: agent.status.current.passes > good.passes, "the failed pass")
        bad = agent.status.current
        assert not bad.last_pass_ok
        got = scrape(m)
        assert value(got, "rdmad_reconcile_passes_total") == bad.passes
        assert value(got, "rdmad_last_successful_reconcile_timestamp_seconds") == (
            good.last_pass_at
        )
    finally:
        await stop_agent(agent, task)


async def test_a_previous_runs_history_is_not_counted_again(tmp_path: Path) -> None:
    clock = FakeClock()
    host = FakeHost()
    first = make_agent(tmp_path, host, TriggerQueue(clock), clock)
    task = await run_agent(first)
    await settle(first, clock)
    await stop_agent(first, task)
    assert any(e.event == "applied" for e in first.status.history())

    queue = TriggerQueue(clock)
    second = make_agent(tmp_path, host, queue, clock)  # same state dir, links in place
    m = Metrics(second.status, queue)
    task = await run_agent(second)
    try:
        await settle(second, clock)
        # The restored history is there to read, but it is not news.
        assert any(e.event == "applied" for e in second.status.history())
        got = scrape(m)
        assert series(got, "rdmad_actions_total") == {}
        assert value(got, "rdmad_objects", state="converged") == 2
    finally:
        await stop_agent(second, task)


# --- the textfile -----------------------------------------------------------------------------


def read_prom(path: Path) -> Samples:
    return parse(path.read_text())


async def test_textfile_written_atomically_and_updated_on_change(
    tmp_path: Path, store: StatusStore, queue: TriggerQueue
) -> None:
    m = Metrics(store, queue)
    writer = TextfileWriter(m, tmp_path, interval=3600, debounce=0.05)
    path = tmp_path / "rdmad.prom"
    writer.start()
    try:
        await wait_for(path.exists, "first textfile")
        assert value(read_prom(path), "rdmad_reconcile_passes_total") == 0
        assert os.stat(path).st_mode & 0o777 == 0o644  # node_exporter reads it as another user
        store.publish(snapshot(1, ObjectReport("x", C), ready=True))
        await wait_for(
            lambda: value(read_prom(path), "rdmad_reconcile_passes_total") == 1,
            "textfile after a status change",
        )
        assert value(read_prom(path), "rdmad_ready") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rdmad.prom"]  # no temp left
    finally:
        m.close()
        await writer.close()
    # The last write says rdmad stopped.
    assert value(read_prom(path), "rdmad_up") == 0


async def test_textfile_rewritten_every_interval_without_changes(
    tmp_path: Path, store: StatusStore, queue: TriggerQueue
) -> None:
    m = Metrics(store, queue)
    writer = TextfileWriter(m, tmp_path, interval=0.05, debounce=0.01)
    path = tmp_path / "rdmad.prom"
    writer.start()
    try:
        await wait_for(path.exists, "first textfile")
        queue.put(Trigger("drift"))  # the queue tells nobody: only the interval sees it
        await wait_for(
            lambda: value(read_prom(path), "rdmad_events_total", source="drift") == 1,
            "periodic rewrite",
        )
    finally:
        await writer.close()


async def test_textfile_in_an_unusable_dir_logs_once_and_never_raises(
    tmp_path: Path, store: StatusStore
) -> None:
    m = Metrics(store)
    missing = tmp_path / "no-such-dir"
    writer = TextfileWriter(m, missing, interval=3600)
    with capture_logs() as logs:
        assert await writer.write_now() is False
        assert await writer.write_now() is False
        missing.mkdir()
        assert await writer.write_now() is True
    assert [(e["event"], e.get("kind")) for e in logs] == [
        ("metrics.textfile-failed", "FileNotFoundError/ENOENT"),
        ("metrics.textfile-recovered", None),
    ]
    assert value(read_prom(missing / "rdmad.prom"), "rdmad_up") == 1

    # A file where the directory should be: a different failure, logged again.
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    writer = TextfileWriter(m, blocked, interval=3600, debounce=0.01)
    with capture_logs() as logs:
        writer.start()
        await wait_for(lambda: len(logs) >= 1, "the failure logged")
        await writer.close()
    assert [e["event"] for e in logs] == ["metrics.textfile-failed"]
    assert logs[0]["kind"] == "NotADirectoryError/ENOTDIR"


async def test_textfile_debounces_a_burst_of_changes(
    tmp_path: Path, store: StatusStore, queue: TriggerQueue
) -> None:
    m = Metrics(store, queue)
    writer = TextfileWriter(m, tmp_path, interval=3600)  # the default: 1 s between writes
    path = tmp_path / "rdmad.prom"
    writer.start()
    try:
        await wait_for(lambda: writer.writes == 1, "first textfile")
        for n in range(1, 21):  # a burst, the writer running in between
            store.publish(snapshot(n, ObjectReport("x", C)))
            await asyncio.sleep(0)
        await wait_for(lambda: writer.writes >= 2, "a write after the burst")
        # That one write has the burst's last state: it waited for the burst to end.
        assert value(read_prom(path), "rdmad_reconcile_passes_total") == 20
        assert writer.writes == 2  # the whole burst cost one write
    finally:
        await writer.close()


def test_guard_and_pause_gauges(store: StatusStore) -> None:
    from rdmad.model import PauseObserved

    m = Metrics(store)

    def pf(name: str, guard: str) -> ObjectReport:
        d = sriov_detail(name, 2, 2)
        return ObjectReport(
            f"sriov {name}",
            C,
            detail=msgspec.structs.replace(d, observed={**d.observed, "guard": guard}),
        )

    store.publish(
        snapshot(
            1,
            pf("pci=0000:00:03.0", "installed (modprobe -r igb asks the guard)"),
            pf("pci=0000:00:04.0", "not installed yet for igb"),
            pf("pci=0000:00:05.0", "off (driver_guard = false)"),
            pf("pci=0000:00:06.0", "not needed (igb is built in: it cannot be unloaded)"),
            pause=PauseObserved("`modprobe -r igb` (modprobe (pid 7), uid 0)", "stop", 1.0, 121.0),
        )
    )
    got = scrape(m)
    assert series(got, "rdmad_guard_installed") == {
        frozenset({("pf", "pci=0000:00:03.0")}): 1,
        frozenset({("pf", "pci=0000:00:04.0")}): 0,
    }
    assert value(got, "rdmad_paused") == 1
    store.publish(snapshot(2))
    assert value(scrape(m), "rdmad_paused") == 0


def test_degraded_gauge_names_the_object(store: StatusStore) -> None:
    """rdmad_object_degraded: one series per object, so an alert can say which (peermem)."""
    m = Metrics(store)
    store.publish(
        snapshot(
            1,
            ObjectReport("peermem", D, message="required, but nvidia is not loaded"),
            ObjectReport("sriov pci=0000:00:03.0", D, detail=sriov_detail(PF, 2, 2)),
            ObjectReport("rxe rxe0", C),
        )
    )
    got = scrape(m)
    assert series(got, "rdmad_object_degraded") == {
        frozenset({("object", "peermem")}): 1,
        frozenset({("object", "sriov pci=0000:00:03.0")}): 1,
        frozenset({("object", "rxe rxe0")}): 0,
    }
    assert value(got, "rdmad_objects", state="degraded") == 2
    store.publish(snapshot(2, ObjectReport("peermem", C), ObjectReport("rxe rxe0", C)))
    assert series(scrape(m), "rdmad_object_degraded") == {
        frozenset({("object", "peermem")}): 0,
        frozenset({("object", "rxe rxe0")}): 0,
    }


def test_rdma_netns_mode_gauge(store: StatusStore) -> None:
    m = Metrics(store)

    def rdma(live: str | None) -> ObjectReport:
        observed = {"netns_mode": live, "ib_core_loaded": live is not None}
        return ObjectReport("rdma", C, detail=ObjectDetail(kind="rdma", observed=observed))

    store.publish(snapshot(1, rdma("exclusive")))
    assert series(scrape(m), "rdmad_rdma_netns_mode") == {
        frozenset({("mode", "exclusive")}): 1,
        frozenset({("mode", "shared")}): 0,
    }
    store.publish(snapshot(2, rdma(None)))  # ib_core not loaded: no series
    assert series(scrape(m), "rdmad_rdma_netns_mode") == {}


def test_sriov_autoprobe_gauge_only_where_declared(store: StatusStore) -> None:
    m = Metrics(store)

    def pf(name: str, declared: bool | None, seen: bool | None) -> ObjectReport:
        detail = ObjectDetail(
            kind="sriov",
            desired={"pf": name, "numvfs": 2, "autoprobe": declared},
            observed={"pci": name, "numvfs": 2, "autoprobe": seen},
        )
        return ObjectReport(f"sriov pci={name}", C, detail=detail)

    store.publish(
        snapshot(
            1,
            pf("0000:01:00.0", False, False),
            pf("0000:02:00.0", False, True),  # not yet written
            pf("0000:03:00.0", None, True),  # not declared: no series
            pf("0000:04:00.0", False, None),  # no sriov_drivers_autoprobe file: none
        )
    )
    assert series(scrape(m), "rdmad_sriov_autoprobe") == {
        frozenset({("pf", "0000:01:00.0")}): 0,
        frozenset({("pf", "0000:02:00.0")}): 1,
    }


def test_sriov_eswitch_mode_gauge_only_where_declared_and_read(store: StatusStore) -> None:
    m = Metrics(store)

    def pf(name: str, declared: bool, seen: dict[str, str]) -> ObjectReport:
        detail = ObjectDetail(
            kind="sriov",
            desired={
                "pf": name,
                "numvfs": 2,
                "eswitch": {"mode": "switchdev"} if declared else None,
            },
            observed={"pci": name, "numvfs": 2, "eswitch": seen},
        )
        return ObjectReport(f"sriov pci={name}", C, detail=detail)

    store.publish(
        snapshot(
            1,
            pf("0000:01:00.0", True, {"mode": "switchdev"}),
            pf("0000:02:00.0", True, {"unknown": "EIO"}),  # not read: no series
            pf("0000:03:00.0", False, {"mode": "legacy"}),  # not declared: none
        )
    )
    assert series(scrape(m), "rdmad_sriov_eswitch_mode") == {
        frozenset({("pf", "0000:01:00.0"), ("mode", "switchdev")}): 1,
        frozenset({("pf", "0000:01:00.0"), ("mode", "legacy")}): 0,
    }
