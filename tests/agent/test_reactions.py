"""Reactions: the add a resting pass planned ahead is applied before the next pass
observes, when that pass's events are the ones awaited; anything else disarms it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rdmad.model import Action, AddRxe, Observed
from rdmad.triggers import LAG, Trigger

from .conftest import FakeResult, RigFactory, desired, spin, until
from .test_event_path import NarrowHost


@dataclass
class OrderHost(NarrowHost):
    """Records, in order, each narrow read and each apply."""

    steps: list[str] = field(default_factory=list)

    async def observe_changed(
        self, rdma: bool, links: Mapping[int, bytes | None] | None = None
    ) -> Observed | None:
        self.steps.append("read rdma" if rdma else "read")
        return await NarrowHost.observe_changed(self, rdma, links)

    async def apply(self, action: Action) -> FakeResult:  # type: ignore[override]
        self.steps.append(action.describe())
        return await NarrowHost.apply(self, action)


def netdev_added(name: str, index: int) -> Trigger:
    return Trigger(
        "netlink",
        f"add {name}",
        narrow=True,
        added=True,
        touches=frozenset({name, f"ifindex:{index}"}),
        link=(index, None),
    )


def rdma_removed(name: str, *, announced: bool = True) -> Trigger:
    return Trigger(
        "udev",
        f"remove infiniband {name}",
        stale=True,
        narrow=True,
        rdma=True,
        removed=True,
        announced=announced,
        touches=frozenset({name}),
    )


ADD = "rdma link add rxe0 type rxe netdev eth9"


async def test_the_netdev_awaited_gets_its_link_before_the_pass_observes(rig: RigFactory) -> None:
    host = OrderHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    # The news carries the netdev (here: the fake host shows it on its next read).
    host.netdevs.append("eth9")
    r.agent.queue.put(netdev_added("eth9", 9))
    await until(lambda: ADD in host.steps, "rxe added")
    await r.idle()
    # Applied first; then the same pass read the RDMA links it changed: its check.
    assert host.steps[:2] == [ADD, "read rdma"]
    assert [a for a in host.applied if isinstance(a, AddRxe)] == [host.applied[0]]
    assert r.agent.runner.fast.reactions_applied == 1
    assert host.links == {"rxe0": "eth9"}
    assert r.agent.state.managed_rxe == {"rxe0"}
    [entry] = [h for h in r.agent.status.history() if h.kind == "add-rxe"][-1:]
    assert entry.cause == "netlink (planned ahead)", entry
    await r.stop()


async def test_a_peer_announced_first_waits_for_the_netdev_awaited(rig: RigFactory) -> None:
    """A veth's peer is announced just before the netdev a reaction awaits: its news
    starts no pass of its own (which would hold the loop while the awaited news waits);
    the pass both start reacts first."""
    host = OrderHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    passes = len(r.agent.passes)
    host.steps.clear()
    assert r.agent.queue.awaited_netdevs == {"eth9"}
    host.netdevs += ["peer9", "eth9"]
    r.agent.queue.put(netdev_added("peer9", 8))
    await spin()  # fake time stands still: only the awaited news or LAG ends the wait
    pending = r.agent.queue.pending
    assert pending is not None and pending.lagging and len(r.agent.passes) == passes
    r.agent.queue.put(netdev_added("eth9", 9))
    await until(lambda: ADD in host.steps, "rxe added")
    assert host.steps[0] == ADD and r.agent.runner.fast.reactions_applied == 1
    await until(lambda: len(r.agent.passes) > passes, "the pass recorded")
    assert r.agent.passes[passes].triggers == 2
    await r.stop()


async def test_a_new_netdev_nothing_awaits_gets_its_pass_after_lag(rig: RigFactory) -> None:
    host = OrderHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    passes = len(r.agent.passes)
    host.netdevs.append("peer9")
    r.agent.queue.put(netdev_added("peer9", 8))
    await spin()
    assert len(r.agent.passes) == passes
    await r.advance(LAG)
    await until(lambda: len(r.agent.passes) > passes, "the pass for peer9")
    assert r.agent.runner.fast.reactions_applied == 0 and host.links == {}
    # Nothing awaited (the link is there): a new netdev starts its pass at once.
    host.netdevs.append("eth9")
    r.agent.queue.put(netdev_added("eth9", 9))
    await until(lambda: host.links == {"rxe0": "eth9"}, "rxe added")
    await r.idle()
    assert r.agent.queue.awaited_netdevs == frozenset()
    passes = len(r.agent.passes)
    r.agent.queue.put(netdev_added("peer7", 7))
    await until(lambda: len(r.agent.passes) > passes, "a pass at once")
    await r.stop()


async def test_a_removed_link_is_added_again_on_the_kernels_own_removal(rig: RigFactory) -> None:
    host = OrderHost(netdevs=["eth9"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    assert host.links == {"rxe0": "eth9"}
    host.steps.clear()
    del host.links["rxe0"]
    r.agent.queue.put(rdma_removed("rxe0"))
    await until(lambda: ADD in host.steps, "rxe added again")
    assert host.steps[0] == ADD and r.agent.runner.fast.reactions_applied == 1
    await r.stop()


async def test_the_pass_a_reaction_starts_is_its_check_and_arms_again(rig: RigFactory) -> None:
    """Its observation comes after the add: with nothing more to do it is at rest, arms
    the next reaction at once and needs no follow-up (the next removal, as soon as a
    bench's half-second later, meets the reflex armed, not a pass in progress)."""
    host = OrderHost(netdevs=["eth9"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    for round_ in (1, 2):
        passes = len(r.agent.passes)
        host.steps.clear()
        del host.links["rxe0"]
        r.agent.queue.put(rdma_removed("rxe0"))
        await until(lambda: ADD in host.steps, "rxe added again")
        await r.idle()
        assert host.steps == [ADD, "read rdma"], host.steps
        assert len(r.agent.passes) == passes + 1, [p.cause for p in list(r.agent.passes)[passes:]]
        assert r.agent.runner.fast.reactions_applied == round_
    assert host.links == {"rxe0": "eth9"}
    await r.stop()


async def test_udevds_late_copy_of_a_removal_does_not_react(rig: RigFactory) -> None:
    """udevd passes the removal on later, maybe after the link is back: only the
    kernel's own uevent is trusted to mean "gone now"; the copy gets a pass (a read)."""
    host = OrderHost(netdevs=["eth9"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    host.steps.clear()
    r.agent.queue.put(rdma_removed("rxe0", announced=False))
    await r.idle()
    assert host.steps == ["read rdma"] and r.agent.runner.fast.reactions_applied == 0
    assert host.links == {"rxe0": "eth9"}
    await r.stop()


async def test_anything_else_in_the_batch_leaves_it_to_the_pass(rig: RigFactory) -> None:
    host = OrderHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    host.netdevs.append("eth9")
    # An RDMA device came too (maybe someone else's link on eth9): read, then plan.
    r.agent.queue.put(netdev_added("eth9", 9))
    r.agent.queue.put(
        Trigger("udev", "add infiniband rxe5", narrow=True, rdma=True, announced=True)
    )
    await until(lambda: ADD in host.steps, "rxe added by the pass")
    assert host.steps[0] == "read rdma" and r.agent.runner.fast.reactions_applied == 0
    await r.idle()
    # eth9 renamed away in the same batch as its arrival: the name is not to be trusted.
    del host.links["rxe0"]
    host.netdevs.remove("eth9")
    await r.idle()
    host.steps.clear()
    r.agent.queue.put(netdev_added("eth9", 10))
    r.agent.queue.put(
        Trigger(
            "netlink",
            "change eth7 (was eth9)",
            stale=True,
            narrow=True,
            touches=frozenset({"eth7", "eth9", "ifindex:10"}),
            link=(10, None),
        )
    )
    await r.idle()
    assert ADD not in host.steps[:1] and r.agent.runner.fast.reactions_applied == 0
    await r.stop()


async def test_a_dry_run_plans_and_reports_but_never_reacts(rig: RigFactory) -> None:
    host = OrderHost(netdevs=["eth0"])
    r = rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host, dry_run=True)
    await r.start()
    await r.idle()
    host.netdevs.append("eth9")
    r.agent.queue.put(netdev_added("eth9", 9))
    await r.idle()
    assert r.agent.runner.fast.reactions_applied == 0 and host.steps[0] == "read"
    await r.stop()
