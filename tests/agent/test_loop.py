"""The agent loop against a fake host and a fake clock: no test sleeps."""

from __future__ import annotations

import asyncio
import errno
import itertools

from rdmad.model import AddRxe, ObjectState
from rdmad.triggers import Trigger

from .conftest import FakeHost, RigFactory, desired, spin, until


async def test_first_trigger_on_idle_loop_starts_a_pass_at_once(rig: RigFactory) -> None:
    r = await rig().start()
    await r.idle()
    before = len(r.agent.passes)
    r.agent.trigger("udev", "add net eth3")
    await until(lambda: len(r.agent.passes) == before + 1, "leading-edge pass")
    p = r.agent.passes[-1]
    assert p.started - p.first_trigger_at == 0.0  # no settle delay on the leading edge
    await r.stop()


async def test_burst_of_1000_events_costs_at_most_3_passes(rig: RigFactory) -> None:
    r = await rig().start()
    await r.idle()
    before = len(r.agent.passes)
    # 1,000 uevents over 0.5 s of (fake) time, as a driver reload sends them.
    for i in range(1000):
        r.agent.trigger("udev", f"add net eth{i}")
        if i % 10 == 9:
            await r.advance(0.005)
    await r.idle()
    passes = len(r.agent.passes) - before
    assert 1 <= passes <= 3, [p.triggers for p in list(r.agent.passes)[before:]]
    assert sum(p.triggers for p in list(r.agent.passes)[before:]) == 1000
    await r.stop()


async def test_instant_burst_during_a_pass_merges_into_one_follow_up(rig: RigFactory) -> None:
    host = FakeHost()
    r = rig(host=host)
    await r.start()
    await r.idle()
    before = len(r.agent.passes)

    def burst() -> None:
        if len(r.agent.passes) == before:  # during the leading-edge pass only
            for i in range(1000):
                r.agent.trigger("netlink", f"change {i}")

    host.on_observe = burst
    r.agent.trigger("udev", "first")
    await r.idle()
    assert len(r.agent.passes) - before == 2
    await r.stop()


async def test_trigger_within_settle_window_is_answered_at_its_end(rig: RigFactory) -> None:
    r = await rig(desired(settle="150ms")).start()
    await r.idle()
    before = len(r.agent.passes)
    r.agent.trigger("udev", "a")
    await until(lambda: len(r.agent.passes) == before + 1)
    await r.advance(0.05)
    r.agent.trigger("udev", "b")  # within the settle window after the pass
    r.agent.trigger("udev", "c")
    await r.advance(0.09)
    assert len(r.agent.passes) == before + 1  # still in the window
    await r.advance(0.02)
    assert len(r.agent.passes) == before + 2  # one pass for both, at the window's end
    p = r.agent.passes[-1]
    assert p.triggers == 2
    assert p.started - p.first_trigger_at <= 0.15 + 1e-9  # never more than settle
    await r.stop()


async def test_burst_waits_for_quiet_but_not_forever(rig: RigFactory) -> None:
    r = await rig(desired(settle="150ms")).start()
    await r.idle()
    before = len(r.agent.passes)
    # An endless stream (one trigger per 10 ms for 6 s): passes at most every settle_max.
    for i in range(600):
        r.agent.trigger("udev", f"change {i}")
        await r.advance(0.01)
    passes = len(r.agent.passes) - before
    assert 3 <= passes <= 5, passes
    await r.stop()


async def test_stream_taken_in_small_batches_is_coalesced_as_a_burst(rig: RigFactory) -> None:
    """Link news one every 30 ms for 9 s: a loop fast enough to take them in batches
    below ``burst`` still waits for quiet (bounded by settle_max) once the stream is
    long, instead of answering each small batch soon or a settle window later."""
    r = await rig(desired(settle="150ms")).start()
    await r.idle()
    before = len(r.agent.passes)
    for i in range(300):
        r.agent.queue.put(Trigger("netlink", f"add v{i}", narrow=True, added=True))
        await r.advance(0.03)
    await r.advance(3.0, step=0.1)
    await r.idle()
    passes = list(r.agent.passes)[before:]
    assert sum(p.triggers for p in passes) == 300
    # Before the stream counted: 135 passes (1, 1, 1, 1, 6, ... for 9 s). Now the same
    # while the first STREAM_BURSTS * burst triggers come, then one per settle_max: 21.
    assert len(passes) <= 25, [p.triggers for p in passes]
    await r.stop()


async def test_converges_and_verifies_then_rests(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth0"), ("rxe1", "eth1"))).start()
    await r.idle()
    assert r.host.links == {"rxe0": "eth0", "rxe1": "eth1"}
    states = {o.obj: o.state for o in r.agent.status.current.objects}
    assert states == {"rxe rxe0": ObjectState.CONVERGED, "rxe rxe1": ObjectState.CONVERGED}
    # One pass applied, one verified; nothing since, however long we wait short of drift.
    n = len(r.agent.passes)
    await r.advance(100.0, step=10.0)
    assert len(r.agent.passes) == n
    assert r.agent.state.managed_rxe == {"rxe0", "rxe1"}
    await r.stop()


async def test_drift_timer_observes_again(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth0"), drift_interval="5m")).start()
    await r.idle()
    n = len(r.agent.passes)
    r.host.links.clear()  # someone deleted it; no event told us
    await r.advance(301.0, step=10.0)
    await r.idle()
    assert any(p.cause == "drift" for p in list(r.agent.passes)[n:])
    assert r.host.links == {"rxe0": "eth0"}
    await r.stop()


async def test_backoff_grows_and_is_capped(rig: RigFactory) -> None:
    host = FakeHost(fail={"rxe0": errno.EBUSY})
    r = rig(desired(("rxe0", "eth0")), host=host, backoff_base=1.0, backoff_cap=8.0)
    await r.start()
    attempts: list[float] = []
    seen = 0
    for _ in range(400):  # 40 s of fake time in 0.1 s steps
        adds = [a for a in host.applied if isinstance(a, AddRxe)]
        if len(adds) > seen:
            attempts.extend([r.clock.now] * (len(adds) - seen))
            seen = len(adds)
        await r.advance(0.1)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(attempts)]
    # Sampled every 0.1 s of fake time, so each gap is exact to one step.
    for got, want in zip(gaps, [1.0, 2.0, 4.0, 8.0], strict=False):
        assert abs(got - want) <= 0.11, gaps
    assert len(gaps) >= 6 and all(abs(g - 8.0) <= 0.11 for g in gaps[4:]), gaps  # capped
    status = {o.obj: o for o in r.agent.status.current.objects}["rxe rxe0"]
    assert status.state is ObjectState.DEGRADED
    assert "EBUSY" in (status.last_error or "")
    assert status.failures == len(attempts)
    await r.stop()


async def test_degraded_object_does_not_block_others(rig: RigFactory) -> None:
    host = FakeHost(fail={"rxe0": errno.EBUSY})
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1"), ("rxe2", "eth2")), host=host)
    await r.start()
    await r.idle()
    assert host.links == {"rxe1": "eth1", "rxe2": "eth2"}
    states = {o.obj: o.state for o in r.agent.status.current.objects}
    assert states["rxe rxe0"] is ObjectState.DEGRADED
    assert states["rxe rxe1"] is ObjectState.CONVERGED
    assert states["rxe rxe2"] is ObjectState.CONVERGED
    assert "rxe rxe0" in r.agent.status.current.summary()
    # Recovery: the failure goes away, the retry converges it and it says so.
    del host.fail["rxe0"]
    await r.advance(10.0, step=0.5)
    await r.idle()
    assert host.links["rxe0"] == "eth0"
    assert any(h.event == "recovered" for h in r.agent.status.history())
    await r.stop()


async def test_applied_but_not_taking_effect_is_a_failure(rig: RigFactory) -> None:
    host = FakeHost(ignore={"rxe0"})
    r = rig(desired(("rxe0", "eth0")), host=host)
    await r.start()
    await r.idle()
    adds = [a for a in host.applied if isinstance(a, AddRxe)]
    # ~40 s of fake time: backoff 1, 2, 4, 8, 16 s between attempts, not a tight loop.
    assert 2 <= len(adds) <= 6
    o = r.agent.status.current.objects[0]
    assert o.state is ObjectState.DEGRADED
    assert "still shows the old state" in (o.last_error or "")
    await r.stop()


async def test_stale_trigger_mid_pass_stops_applying_and_reobserves(rig: RigFactory) -> None:
    host = FakeHost()
    host.gate = asyncio.Event()
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")), host=host)
    task_started = r.start()
    t = asyncio.get_running_loop().create_task(task_started)
    await until(lambda: host.in_apply, "first apply")
    r.agent.queue.put(Trigger("udev", "move net eth1 (was eth9)", stale=True))
    host.gate.set()
    await t
    assert [a.name for a in host.applied if isinstance(a, AddRxe)] == ["rxe0"]
    await r.idle()
    assert host.links == {"rxe0": "eth0", "rxe1": "eth1"}
    await r.stop()


async def test_sigterm_mid_apply_finishes_the_action_then_exits(rig: RigFactory) -> None:
    host = FakeHost()
    host.gate = asyncio.Event()
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")), host=host)
    run = asyncio.get_running_loop().create_task(r.agent.run())
    await until(lambda: host.in_apply, "apply in flight")
    r.agent.stop()
    await spin()
    assert not run.done()  # the action in flight is not abandoned
    host.gate.set()
    await asyncio.wait_for(run, 5)
    assert host.links == {"rxe0": "eth0"}  # finished, and nothing after it
    assert r.notes.count("STOPPING=1") == 1
    # The state file has what was applied.
    assert r.agent.state_store is not None
    saved, problem = r.agent.state_store.load()
    assert problem is None and saved is not None and saved.managed_rxe == {"rxe0"}


async def test_dry_run_changes_nothing_and_logs_what_it_would_do(rig: RigFactory) -> None:
    host = FakeHost()
    r = rig(desired(("rxe0", "eth0")), host=host, dry_run=True)

    asked: list[object] = []

    async def recording(action: object) -> object:
        from .conftest import FakeResult, FakeWrite

        asked.append(action)
        return FakeResult((FakeWrite("rdma link rxe0", None, "rxe on eth0", dry_run=True),))

    host.apply = recording  # type: ignore[method-assign,assignment]
    await r.start()
    await r.idle()
    # The dry-run host was asked for the one write a real run makes, once...
    assert [(type(a), getattr(a, "name", None)) for a in asked] == [(AddRxe, "rxe0")]
    # ...and the agent takes nothing as done: rxe0 is neither claimed nor remembered as
    # rdmad's (a real run claims it before the add), and no follow-up pass verifies it.
    assert r.agent.memory.state.managed_rxe == set()
    assert len(r.agent.passes) == 1
    assert r.agent.ready
    hist = [h for h in r.agent.status.history() if h.event == "recorded"]
    assert hist and hist[0].what == "rdma link rxe0: unset -> rxe on eth0"
    assert r.agent.status.current.pending_actions
    assert not (r.agent.state_store.path.exists() if r.agent.state_store else False)
    await r.stop()


async def test_blocked_reason_is_logged_once_per_change_and_in_status(rig: RigFactory) -> None:
    from structlog.testing import capture_logs

    host = FakeHost(links={"other": "eth0"})  # not rdmad's: rxe0 cannot go on eth0
    with capture_logs() as logs:
        r = await rig(desired(("rxe0", "eth0"), drift_interval="5m"), host=host).start()
        await r.idle()
        await r.advance(301.0, step=10.0)  # a drift pass: same reason, not logged again
        await r.idle()
        blocked = [e for e in logs if e["event"] == "object.blocked"]
        assert len(blocked) == 1, blocked
        assert blocked[0]["obj"] == "rxe rxe0"
        assert "already carries rxe link 'other'" in blocked[0]["reason"]
        status = [n for n in r.notes.sent if "STATUS=" in n][-1]
        assert "rxe rxe0: eth0 already carries rxe link 'other'" in status
        del host.links["other"]
        r.agent.trigger("netlink", "del other")
        await r.idle()
        assert [e["obj"] for e in logs if e["event"] == "object.unblocked"] == ["rxe rxe0"]
    await r.stop()


async def test_backoff_holds_back_the_failed_action_not_a_new_one(rig: RigFactory) -> None:
    # An attribute the driver always refuses (igb: max_tx_rate EINVAL) keeps its object in
    # backoff; a driver reload then needs a different action (restore numvfs), which must
    # not wait for that backoff (it can be minutes).
    from rdmad.model import Action, Desired, Observed, PlanState

    host = FakeHost(fail={"refused": errno.EINVAL})
    wanted = ["refused"]

    def planner(d: Desired, o: Observed, s: PlanState) -> list[Action]:
        return [
            AddRxe("rxe rxe0", "r", name=n, netdev="eth0") for n in wanted if o.rdma_link(n) is None
        ]

    r = rig(desired(("rxe0", "eth0")), host=host, backoff_base=100.0, backoff_cap=300.0)
    r.agent.planner = planner
    await r.start()
    await r.idle()
    refused = [a for a in host.applied if a.name == "refused"]  # type: ignore[attr-defined]
    assert len(refused) == 1  # in backoff for 100 s
    wanted.insert(0, "new")  # a new situation for the same object
    r.agent.trigger("udev", "add module igb", driver=True)
    await r.idle()
    assert host.links.get("new") == "eth0"  # applied at once, despite the backoff
    assert len([a for a in host.applied if a.name == "refused"]) == 1  # type: ignore[attr-defined]
    await r.stop()
