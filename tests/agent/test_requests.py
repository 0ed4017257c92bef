"""What the API relies on: plan-only requests, trigger numbers and store listeners."""

from __future__ import annotations

from rdmad.model import AddRxe
from rdmad.status import Change, HistoryEntry, StatusSnapshot, StatusStore
from rdmad.triggers import Trigger
from tests.agent.conftest import RigFactory, desired, until


async def test_plan_only_request_observes_and_plans_but_applies_nothing(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth0"))).start()
    await r.idle()
    r.host.links.clear()  # someone deleted rxe0: the next pass would re-create it
    observes, passes, applied = r.host.observes, len(r.agent.passes), len(r.host.applied)

    number = r.agent.queue.put(Trigger("api", "plan", plan_only=True))
    await until(lambda: (r.agent.status.plan or _NO).answered >= number, "plan for the request")

    report = r.agent.status.plan
    assert report is not None
    assert [type(a) for a in report.actions] == [AddRxe]
    assert [(o.obj, o.state.value) for o in report.objects] == [("rxe rxe0", "pending")]
    assert r.host.observes == observes + 1
    assert len(r.host.applied) == applied  # nothing applied
    assert len(r.agent.passes) == passes  # and it is not counted as a reconcile pass
    assert r.host.links == {}
    await r.stop()


async def test_a_plan_request_merged_with_another_trigger_is_a_full_pass(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth0"))).start()
    await r.idle()
    r.host.links.clear()
    r.agent.queue.put(Trigger("api", "plan", plan_only=True))
    number = r.agent.queue.put(Trigger("udev", "something"))
    await until(lambda: r.agent.status.current.answered >= number, "the pass answering both")
    plan = r.agent.status.plan
    assert plan is not None and plan.answered >= number
    await until(lambda: "rxe0" in r.host.links, "rxe0 re-created")
    await r.stop()


async def test_status_says_which_triggers_it_answered(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth0"))).start()
    await r.idle()
    before = r.agent.status.current.answered
    number = r.agent.queue.put(Trigger("api", "reconcile"))
    assert number > before
    await until(lambda: r.agent.status.current.answered >= number, "a pass after the request")
    assert r.agent.queue.by_source["api"] == 1
    await r.stop()


def test_store_listeners_hear_every_change_and_a_failing_one_is_dropped() -> None:
    store = StatusStore()
    heard: list[Change] = []
    calls = 0

    def broken(change: Change) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("listener bug")

    store.subscribe(heard.append)
    store.subscribe(broken)
    store.publish(StatusSnapshot(passes=1))
    store.record([HistoryEntry(1.0, "applied", obj="a"), HistoryEntry(2.0, "failed", obj="b")])
    assert [kind for kind, _ in heard] == ["status", "history", "history"]
    assert calls == 1  # dropped after its first failure; the writer went on
    assert store.current.passes == 1 and len(store.history()) == 2
    store.unsubscribe(heard.append)
    store.publish(StatusSnapshot(passes=2))
    assert len(heard) == 3


class _NoPlan:
    answered = -1


_NO = _NoPlan()
