"""READY, RELOADING, STATUS, WATCHDOG, reload with a bad config, state across restarts."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import msgspec
import pytest

from rdmad.agent.options import AgentOptions
from rdmad.agent.runner import budget_for
from rdmad.model import (
    Action,
    ApiSpec,
    MetricsSpec,
    Observed,
    PlanState,
    SetEswitch,
    SetNumVfs,
    Waiting,
)
from rdmad.state import State, StateStore

from .conftest import FakeHost, RigFactory, desired, until


async def test_ready_after_first_converged_pass_with_status(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0")))
    await r.start()
    assert r.notes.count("READY=1") == 0  # the first pass changed the kernel: verify first
    await r.idle()
    assert r.notes.count("READY=1") == 1
    ready = next(s for s in r.notes.sent if s.startswith("READY=1"))
    assert "STATUS=1 object(s), 1 converged" in ready
    await r.stop()


async def test_ready_reports_what_could_not_be_done(rig: RigFactory) -> None:
    host = FakeHost(fail={"rxe0": errno.EBUSY})
    r = rig(desired(("rxe0", "eth0")), host=host)
    await r.start()
    await r.idle()
    ready = [s for s in r.notes.sent if s.startswith("READY=1")]
    assert len(ready) == 1
    assert "degraded" in ready[0] and "EBUSY" in ready[0]
    await r.stop()


async def test_ready_waits_for_vfs_then_deadline_bounds_it(rig: RigFactory) -> None:
    """After sriov_numvfs, READY waits (event-driven) for the VFs, within a deadline."""
    host = FakeHost()
    vfs_there = False

    def planner(d: object, o: Observed, s: PlanState) -> list[Action]:
        obj = "sriov pci=0000:01:00.0"
        if not host.applied:
            return [SetNumVfs(obj, "restore 4 VFs", pci="0000:01:00.0", old=0, new=4)]
        return [] if vfs_there else [Waiting(obj, "VF 0 of 0000:01:00.0 has not appeared yet")]

    r = rig(desired(startup_timeout="20s"), host=host, vf_wait=5.0)
    r.agent.planner = planner
    await r.start()
    await r.advance(1.0, step=0.1)
    assert not r.agent.ready  # waiting for the VFs to appear
    vfs_there = True
    r.agent.trigger("udev", "add pci 0000:01:00.1")  # the VF's uevent
    await until(lambda: r.agent.ready, "READY after the VFs appeared")
    assert r.clock.now - r.agent.started_at < 2.0
    await r.stop()

    # Same, but the VFs never come: READY at the VF deadline, object degraded.
    host2 = FakeHost()

    def never(d: object, o: Observed, s: PlanState) -> list[Action]:
        obj = "sriov pci=0000:01:00.0"
        if not host2.applied:
            return [SetNumVfs(obj, "restore 4 VFs", pci="0000:01:00.0", old=0, new=4)]
        return [Waiting(obj, "VF 0 of 0000:01:00.0 has not appeared yet")]

    r2 = rig(desired(startup_timeout="20s"), host=host2, vf_wait=5.0)
    r2.agent.planner = never
    await r2.start()
    await r2.advance(4.0, step=0.5)
    assert not r2.agent.ready
    await r2.advance(2.0, step=0.5)
    assert r2.agent.ready
    (o,) = r2.agent.status.current.objects
    assert o.state.value == "degraded" and "VFs of 0000:01:00.0 to appear" in o.message
    await r2.stop()


async def test_startup_deadline_sends_ready_when_observe_keeps_failing(rig: RigFactory) -> None:
    class Broken(FakeHost):
        async def observe(self) -> Observed:
            raise OSError(errno.EIO, "sysfs unreadable")

    r = rig(desired(startup_timeout="3s"), host=Broken())
    await r.start()
    assert not r.agent.ready
    await r.advance(3.1, step=0.1)
    assert r.agent.ready and r.notes.count("READY=1") == 1
    assert any("observing the kernel failed" in n for n in r.agent.status.current.notes)
    # Observation is retried with backoff, not in a tight loop.
    assert len(r.agent.passes) <= 4
    await r.stop()


async def test_sighup_with_bad_config_keeps_last_good_and_reports(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0")))
    await r.start()
    await r.idle()
    r.cfg.errors = ["rxe[0].netdev: unknown key", "sriov[0].numvfs: must be >= 0"]
    r.agent.request_reload("sighup")
    await r.idle()
    st = r.agent.status.current
    assert st.config_errors == (
        "/etc/rdmad/rdmad.toml: rxe[0].netdev: unknown key",
        "/etc/rdmad/rdmad.toml: sriov[0].numvfs: must be >= 0",
    )
    assert "config invalid (2 error(s)), last good kept" in st.summary()
    # The last good config still rules: rxe0 is kept, and restored when lost.
    r.host.links.clear()
    r.agent.trigger("udev", "remove infiniband rxe0")
    await r.idle()
    assert r.host.links == {"rxe0": "eth0"}
    # RELOADING=1 then READY=1 around the reload.
    seq = [s.split("\n")[0] for s in r.notes.sent if s.startswith(("RELOADING", "READY"))]
    assert seq[-2:] == ["RELOADING=1", "READY=1"]
    # A good config again: the errors go, the new declaration applies.
    r.cfg.errors = []
    r.cfg.desired = desired(("rxe0", "eth0"), ("rxe1", "eth1"))
    r.agent.request_reload("sighup")
    await r.idle()
    assert r.agent.status.current.config_errors == ()
    assert r.host.links == {"rxe0": "eth0", "rxe1": "eth1"}
    events = [h.event for h in r.agent.status.history()]
    assert "config-invalid" in events and "config-reloaded" in events
    await r.stop()


async def test_a_reload_says_which_keys_only_a_restart_applies(rig: RigFactory) -> None:
    """[api] and [metrics] (and [daemon] logging, state_dir) are set up once, at start: a
    reload that changes them says they need a restart (status note, history, journal)
    instead of seeming to take them; a config that puts them back clears the note."""
    started = desired(("rxe0", "eth0"))
    r = rig(started, started_with=started)
    await r.start()
    await r.idle()
    r.cfg.desired = msgspec.structs.replace(
        desired(("rxe0", "eth0"), drift_interval="1m", log_level="debug"),
        api=ApiSpec(socket="/run/elsewhere.sock"),
        metrics=MetricsSpec(listen="127.0.0.1:9478"),
    )
    r.agent.request_reload("sighup")
    await r.idle()
    note = (
        "the config changes api.socket, metrics.listen, daemon.log_level: read at start "
        "only, in effect after `systemctl restart rdmad`; until then the old values stay"
    )
    assert note in r.agent.status.current.notes
    [reloaded] = [h for h in r.agent.status.history() if h.event == "config-reloaded"]
    assert reloaded.reason == note
    assert r.agent.options.drift_interval == 60.0  # a reload applies what it can
    r.cfg.desired = started
    r.agent.request_reload("sighup")
    await r.idle()
    assert not any("restart" in n for n in r.agent.status.current.notes)
    await r.stop()


async def test_a_reload_of_a_key_the_command_line_sets_says_the_command_line_wins(
    rig: RigFactory,
) -> None:
    """`rdmad run --log-level` sets daemon.log_level: a reload that changes it in the
    config does not promise it for the next restart (the command line wins then too);
    the keys the command line does not set still need a restart."""
    started = desired(("rxe0", "eth0"))
    r = rig(started, started_with=started, command_line=("daemon.log_level",))
    await r.start()
    await r.idle()
    r.cfg.desired = msgspec.structs.replace(
        desired(("rxe0", "eth0"), log_level="debug"), api=ApiSpec(socket="/run/elsewhere.sock")
    )
    r.agent.request_reload("sighup")
    await r.idle()
    note = (
        "the config changes api.socket: read at start only, in effect after `systemctl "
        "restart rdmad`; until then the old values stay; the config changes "
        "daemon.log_level, which rdmad's command line sets (--log-level): the command "
        "line wins, also after a restart"
    )
    assert note in r.agent.status.current.notes
    [reloaded] = [h for h in r.agent.status.history() if h.event == "config-reloaded"]
    assert reloaded.reason == note
    await r.stop()


def test_the_command_line_keys_of_rdmad_run() -> None:
    from rdmad.daemon import RunOptions, command_line_keys

    assert command_line_keys(RunOptions(config=Path("/etc/rdmad"))) == ()
    assert command_line_keys(
        RunOptions(config=Path("/etc/rdmad"), log_level="debug", log_format="json")
    ) == ("daemon.log_level", "daemon.log_format")


async def test_invalid_config_at_start_manages_nothing_and_deletes_nothing(
    rig: RigFactory, tmp_path: object
) -> None:
    host = FakeHost(links={"rxe0": "eth0"})
    r = rig(desired(), host=host)
    r.cfg.errors = ["broken"]
    r.agent.state.managed_rxe = {"rxe0"}  # as if a previous run created it
    await r.start()
    await r.idle()
    assert host.links == {"rxe0": "eth0"} and not host.applied
    assert r.agent.ready and r.agent.status.current.config_errors
    await r.stop()


async def test_undeclared_rxe_created_by_rdmad_is_removed_after_reload(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")))
    await r.start()
    await r.idle()
    r.cfg.desired = desired(("rxe0", "eth0"))
    r.agent.request_reload("api")
    await r.idle()
    assert r.host.links == {"rxe0": "eth0"}
    assert r.agent.state.managed_rxe == {"rxe0"}
    await r.stop()


async def test_watchdog_pings_while_healthy_and_stops_when_stuck(rig: RigFactory) -> None:
    host = FakeHost()
    r = rig(desired(), host=host, watchdog_interval=10.0, action_budget=60.0)
    await r.start()
    await r.advance(35.0, step=1.0)
    assert r.notes.count("WATCHDOG=1") == 3
    # An apply that never returns: pings stop once it overruns its budget.
    host.gate = asyncio.Event()
    r.cfg.desired = desired(("rxe0", "eth0"))
    r.agent.request_reload("sighup")
    await until(lambda: host.in_apply, "apply in flight")
    before = r.notes.count("WATCHDOG=1")
    await r.advance(100.0, step=1.0)
    assert r.notes.count("WATCHDOG=1") - before <= 6  # pinged until the 60 s budget ran out
    pings_when_stuck = r.notes.count("WATCHDOG=1")
    await r.advance(50.0, step=1.0)
    assert r.notes.count("WATCHDOG=1") == pings_when_stuck
    host.gate.set()
    await r.advance(20.0, step=1.0)
    assert r.notes.count("WATCHDOG=1") > pings_when_stuck  # alive again
    await r.stop()


def test_an_eswitch_mode_change_has_the_long_budget_of_a_numvfs_write() -> None:
    # A mode change re-creates every vport (seconds to minutes on real NICs): the
    # watchdog must not count the loop as stuck while the kernel does it.
    o = AgentOptions()
    mode = SetEswitch("o", "r", pci="0000:3b:00.0", changes=(("mode", "legacy", "switchdev"),))
    numvfs = SetNumVfs("o", "r", pci="0000:3b:00.0", old=0, new=8)
    assert budget_for(mode, o) == budget_for(numvfs, o) == o.long_action_budget
    assert budget_for(Waiting("o", "r"), o) == o.action_budget


async def test_status_line_updates_only_on_change(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0")))
    await r.start()
    await r.idle()
    n = r.notes.count("STATUS=")
    for _ in range(5):
        r.agent.trigger("netlink", "change eth0")
        await r.idle()
    assert r.notes.count("STATUS=") == n
    await r.stop()


# --- state ---------------------------------------------------------------------------------


async def test_state_tells_first_start_restart_and_boot(rig: RigFactory, tmp_path: object) -> None:
    from pathlib import Path

    state_dir = Path(str(tmp_path)) / "st"
    r = rig(desired(("rxe0", "eth0")), state_dir=state_dir, boot_id="A")
    await r.start()
    await r.idle()
    await r.stop()
    assert r.agent.start_kind == "first-start"

    # Same boot_id: a daemon restart; managed links are still rdmad's.
    r2 = rig(desired(("rxe0", "eth0")), state_dir=state_dir, boot_id="A")
    await r2.start()
    assert r2.agent.start_kind == "restart"
    assert r2.agent.state.managed_rxe == {"rxe0"}
    await r2.stop()

    # Another boot_id: a reboot; nothing rdmad created survived, it owns nothing yet.
    host = FakeHost()
    r3 = rig(desired(("rxe0", "eth0")), host=host, state_dir=state_dir, boot_id="B")
    await r3.start()
    assert r3.agent.start_kind == "boot"
    await r3.idle()
    starts = [h for h in r3.agent.status.history() if h.event == "start"]
    assert [h.cause for h in starts] == ["first-start", "restart", "boot"]
    applied = [h for h in r3.agent.status.history() if h.event == "applied"]
    assert applied[-1].cause == "boot" and applied[-1].obj == "rxe rxe0"
    await r3.stop()

    data = json.loads((state_dir / "state.json").read_text())
    assert data["boot_id"] == "B" and data["managed_rxe"] == ["rxe0"]
    assert data["applied"]["rxe rxe0"]["reason"] == "declared rxe link is missing"


async def test_driver_reload_is_named_in_history(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0")))
    await r.start()
    await r.idle()
    r.host.links.clear()  # modprobe -r rdma_rxe took the link with it
    r.agent.trigger("udev", "remove module rdma_rxe", driver=True)
    await r.idle()
    applied = [h for h in r.agent.status.history() if h.event == "applied"]
    assert applied[-1].cause == "driver-reload"
    await r.stop()


async def test_corrupt_state_is_reported_and_rebuilt(rig: RigFactory, tmp_path: object) -> None:
    from pathlib import Path

    state_dir = Path(str(tmp_path)) / "st"
    state_dir.mkdir()
    (state_dir / "state.json").write_text("{not json")
    r = rig(desired(("rxe0", "eth0")), state_dir=state_dir)
    await r.start()
    await r.idle()
    assert any("corrupt" in n for n in r.agent.status.current.notes)
    assert (state_dir / "state.json.corrupt").read_text() == "{not json"
    saved, problem = StateStore(state_dir).load()
    assert problem is None and saved is not None and saved.managed_rxe == {"rxe0"}
    await r.stop()


def test_state_save_is_atomic_and_leaves_no_temp(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path)) / "s"
    store = StateStore(d)
    assert store.load() == (None, None)
    st = State(boot_id="x", managed_rxe={"a"})
    assert store.save(st) is None
    assert store.save(msgspec.structs.replace(st, managed_rxe={"b"})) is None
    # No temp file; the claims file is there, empty, for the next claim.
    assert sorted(p.name for p in d.iterdir()) == ["rxe-claims.json", "state.json"]
    loaded, _ = store.load()
    assert loaded is not None and loaded.managed_rxe == {"b"}


def test_an_rxe_claim_is_a_line_read_with_the_state_until_the_next_save(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim before a create is one line appended to its own small file in one write,
    without fsync; reading the state adds the last whole line's claims of the same boot;
    the next save holds them and empties the file (kept: no create on the event path)."""
    import os
    from pathlib import Path

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    d = Path(str(tmp_path)) / "s"
    store = StateStore(d)
    # Before any state file: the claim alone is the state.
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: (writes.append(fd), real_write(fd, b))[1])
    assert store.claim_rxe("boot-1", {"rxe0"}) is None
    assert store.claim_rxe("boot-1", {"rxe0", "rxe5"}) is None
    assert len(writes) == 2, "one write per claim"
    monkeypatch.setattr(os, "write", real_write)
    assert synced == [] and sorted(p.name for p in d.iterdir()) == ["rxe-claims.json"]
    assert len((d / "rxe-claims.json").read_bytes().splitlines()) == 2
    loaded, problem = store.load()
    assert problem is None and loaded is not None
    assert (loaded.boot_id, loaded.managed_rxe) == ("boot-1", {"rxe0", "rxe5"})
    with (d / "rxe-claims.json").open("ab") as fh:
        fh.write(b'{"boot_id": "boot-1", "rx')  # torn (a power loss mid-write)
    loaded, _ = store.load()
    assert loaded is not None and loaded.managed_rxe == {"rxe0", "rxe5"}  # the line before
    # A save holds the claims and empties the file (two fsyncs: file and directory).
    assert store.save(State(boot_id="boot-1", managed_rxe={"rxe0"})) is None
    assert len(synced) == 2
    assert sorted(p.name for p in d.iterdir()) == ["rxe-claims.json", "state.json"]
    assert (d / "rxe-claims.json").read_bytes() == b""
    # A claim after it is added to what the state file says, written without a create.
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a: (opened.append(str(p)), real_open(p, *a))[1])
    assert store.claim_rxe("boot-1", {"rxe0", "rxe1"}) is None
    monkeypatch.setattr(os, "open", real_open)
    assert opened == []
    loaded, _ = store.load()
    assert loaded is not None and loaded.managed_rxe == {"rxe0", "rxe1"}
    # Claims of another boot (the state file's is boot-2) count for nothing.
    assert store.save(State(boot_id="boot-2")) is None
    assert store.claim_rxe("boot-1", {"rxe9"}) is None
    loaded, _ = store.load()
    assert loaded is not None and loaded.managed_rxe == set()
    # A torn or foreign claims file is ignored, never an error.
    (d / "rxe-claims.json").write_text("{not json")
    loaded, problem = store.load()
    assert problem is None and loaded is not None and loaded.boot_id == "boot-2"


def test_state_save_failure_is_a_value_not_an_exception(tmp_path: object) -> None:
    from pathlib import Path

    blocker = Path(str(tmp_path)) / "file"
    blocker.write_text("")
    problem = StateStore(blocker / "sub").save(State())
    assert problem is not None and "not written" in problem


async def test_invalid_config_at_start_says_nothing_is_managed(rig: RigFactory) -> None:
    r = rig(desired(("rxe0", "eth0")))
    r.cfg.errors = ["rxe[0].netdev: unknown key"]
    await r.start()
    await r.idle()
    line = r.agent.status.current.summary()
    assert "config invalid (1 error(s)), no valid config yet: nothing managed" in line, line
    assert r.host.links == {} and r.agent.ready
    await r.stop()
