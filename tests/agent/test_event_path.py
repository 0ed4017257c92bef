"""The event path: link events alone get a narrow observation, and VFs just created
get their settings without waiting out the settle window."""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rdmad.agent import Agent
from rdmad.agent.applying import MAX_REDONE, MODULE_SETTLE
from rdmad.model import (
    Action,
    AddRxe,
    Desired,
    LoadModule,
    ModulesObserved,
    ObjectState,
    Observed,
    PlanState,
    SetNumVfs,
    SetVfSettings,
)
from rdmad.triggers import Trigger
from tests.agent.test_safety import PF, SimHost, igb_like, sriov
from tests.support.records import replace
from tests.support.simkernel import SimKernel

from .conftest import FakeHost, FakeResult, RigFactory, desired, spin, until


@dataclass
class NarrowHost(FakeHost):
    """A FakeHost that can also observe only what link events change."""

    narrow: int = 0
    refuse_narrow: bool = False
    asked: list[bool] = field(default_factory=list)  # rdma asked for, per narrow read
    news: list[dict[int, bytes | None] | None] = field(default_factory=list)  # link news, per read

    async def observe_changed(
        self, rdma: bool, links: Mapping[int, bytes | None] | None = None
    ) -> Observed | None:
        self.asked.append(rdma)
        self.news.append(None if links is None else dict(links))
        if self.refuse_narrow:
            return None  # e.g. a PCI function's netdev changed: the agent reads everything
        self.narrow += 1
        return await FakeHost.observe(self)


async def test_link_event_alone_is_answered_by_a_narrow_observation(rig: RigFactory) -> None:
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9")), host=host).start()
    await r.idle()
    assert host.narrow == 0  # the first pass always reads everything
    full = host.observes
    host.netdevs.append("eth9")
    r.agent.queue.put(_narrow("netlink", "add eth9"))
    await until(lambda: any(isinstance(a, AddRxe) for a in host.applied), "rxe added")
    assert host.narrow == 1 and host.observes == full + 1  # observe_changed counts too
    assert r.agent.runner.fast.narrow_passes == 1
    await r.idle()
    # The pass that changed the kernel is verified by a full observation.
    assert host.observes >= full + 2 and host.narrow == 1
    await r.stop()


async def test_link_news_reach_the_host_and_an_event_without_news_asks_for_a_read(
    rig: RigFactory,
) -> None:
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9")), host=host).start()
    await r.idle()
    host.netdevs.append("eth9")
    # Two news of link 9 and one of link 3 in one batch: the latest of each, in order.
    r.agent.queue.put(Trigger("netlink", "add eth9", narrow=True, link=(9, b"first")))
    r.agent.queue.put(Trigger("netlink", "del eth3", narrow=True, link=(3, None)))
    r.agent.queue.put(Trigger("netlink", "change eth9", narrow=True, link=(9, b"latest")))
    r.agent.queue.put(Trigger("uevent", "remove rxe1", narrow=True, rdma=True))  # no netdev
    await until(lambda: any(isinstance(a, AddRxe) for a in host.applied), "rxe added")
    assert host.news[0] == {3: None, 9: b"latest"} and host.asked[0] is True
    await r.idle()
    # A udev net event changes netdevs but brings no news of them: read them again.
    r.agent.queue.put(Trigger("netlink", "change eth9", narrow=True, link=(9, b"x")))
    r.agent.queue.put(Trigger("udev", "change eth9", narrow=True))
    await until(lambda: len(host.news) == 2, "a second narrow read")
    assert host.news[1] is None
    await r.stop()


async def test_a_batch_with_any_broad_trigger_reads_everything(rig: RigFactory) -> None:
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    await r.idle()
    before = len(r.agent.passes)
    r.agent.queue.put(_narrow("netlink", "add eth5"))
    await until(lambda: len(r.agent.passes) == before + 1, "narrow pass")
    assert host.narrow == 1
    # During the settle window: one narrow trigger and one udev pci event: a full pass.
    r.agent.queue.put(_narrow("netlink", "add eth6"))
    r.agent.trigger("udev", "add pci 0000:00:03.0")
    await r.idle()
    assert host.narrow == 1
    for source in ("drift", "retry", "api"):
        r.agent.trigger(source, "look again")
        await r.idle()
    assert host.narrow == 1
    await r.stop()


async def test_narrow_refused_falls_back_to_a_full_observation(rig: RigFactory) -> None:
    host = NarrowHost(netdevs=["eth0"], refuse_narrow=True)
    r = await rig(desired(("rxe0", "eth9")), host=host).start()
    await r.idle()
    host.netdevs.append("eth9")
    r.agent.queue.put(_narrow("netlink", "add eth9"))
    await until(lambda: any(isinstance(a, AddRxe) for a in host.applied), "rxe added")
    assert host.narrow == 0 and r.agent.runner.fast.narrow_passes == 0
    await r.stop()


async def test_new_vfs_get_their_settings_in_the_pass_that_creates_them(
    rig: RigFactory,
) -> None:
    host = SimHost(SimKernel(igb_like(0)))
    vfs = ({"index": 0, "mac": "02:00:00:00:00:01"}, {"index": 1, "trust": True})
    d = sriov(2, *vfs, drift_interval="1h", settle="5s")
    r = rig(d, host=host)
    await r.start()
    # One pass raised numvfs and set the new VFs at once; the follow-up pass, urgent
    # (not after the 5 s settle window of fake time), verified and found nothing to do.
    await until(lambda: len(r.agent.passes) >= 2, "the follow-up pass")
    assert [type(a) for a in host.applied] == [SetNumVfs, SetVfSettings]
    first, second = list(r.agent.passes)[:2]
    assert (first.applied, first.changed) == (2, True)
    assert second.cause == "followup" and second.started - first.started < 5.0
    assert (second.applied, second.changed) == (0, False)
    [pf] = [p for p in host.kernel.observed.pfs if p.pci == PF]
    vf0, vf1 = pf.vf(0), pf.vf(1)
    assert vf0 is not None and vf0.settings is not None and vf0.settings.mac == "02:00:00:00:00:01"
    assert vf1 is not None and vf1.settings is not None and vf1.settings.trust is True
    await r.stop()


async def test_a_numvfs_decrease_still_waits_out_the_settle_window(rig: RigFactory) -> None:
    host = SimHost(SimKernel(igb_like(4)))
    r = rig(sriov(0, drift_interval="1h", settle="5s"), host=host)
    await r.start()
    await until(lambda: len(host.applied) >= 1, "numvfs 4 -> 0")
    assert [(a.old, a.new) for a in host.applied if isinstance(a, SetNumVfs)] == [(4, 0)]
    before = len(r.agent.passes)
    await r.advance(4.9)
    assert len(r.agent.passes) == before  # nothing urgent: the window holds
    await r.advance(0.2)
    await until(lambda: len(r.agent.passes) > before, "follow-up after the window")
    await r.stop()


def _narrow(source: str, detail: str) -> Trigger:
    return Trigger(source, detail, narrow=True)


@dataclass
class ReleasingHost(FakeHost):
    """rxe adds dropped as stale (the kernel still frees the name) ``stale_adds`` times."""

    stale_adds: int = 0

    async def apply(self, action: Action) -> FakeResult:  # type: ignore[override]
        if isinstance(action, AddRxe) and self.stale_adds > 0:
            self.stale_adds -= 1
            self.applied.append(action)
            return FakeResult((), note="stale: rxe0 is still being removed", stale=True)
        return await FakeHost.apply(self, action)


async def test_a_stale_action_is_planned_again_soon_a_few_times_then_after_settle(
    rig: RigFactory,
) -> None:
    host = ReleasingHost(netdevs=["eth0"], stale_adds=6)
    r = rig(desired(("rxe0", "eth0"), settle="2s", drift_interval="1h"), host=host)
    await r.start()
    await r.advance(0.011)
    await r.advance(0.011)
    await r.advance(0.011)
    starts = [p.started for p in r.agent.passes]
    assert len(starts) == 4  # the first pass and three soon re-plans, 10 ms apart
    await r.advance(1.9, step=0.1)
    assert len(r.agent.passes) == 4  # the streak is over: the settle window again
    await r.idle()
    assert "rxe0" in host.links and host.stale_adds == 0
    await r.stop()


async def test_an_event_on_a_failed_actions_netdev_is_a_new_situation(rig: RigFactory) -> None:
    """Backoff holds back a retry of what failed, not a new situation: the netdev an rxe
    add failed on changed (a bond got its first port), so it is tried again at once."""
    host = FakeHost(netdevs=["bond0"], fail={"rxe0": errno.EINVAL})
    r = rig(desired(("rxe0", "bond0"), drift_interval="1h"), host=host)
    await r.start()
    await r.advance(0.2)
    assert sum(isinstance(a, AddRxe) for a in host.applied) == 1  # failed, backing off
    del host.fail["rxe0"]
    r.agent.trigger("netlink", "change bond0", touches=frozenset({"bond0", "ifindex:1"}))
    await until(lambda: "rxe0" in host.links, "rxe added after the event")
    assert r.agent.passes[-1].cause == "netlink"
    # Events about other netdevs do not cut a backoff short.
    host.fail["rxe1"] = errno.EINVAL
    r.cfg.desired = desired(("rxe0", "bond0"), ("rxe1", "bond1"), drift_interval="1h")
    host.netdevs.append("bond1")
    r.agent.request_reload()
    await r.advance(0.2)
    tries = sum(isinstance(a, AddRxe) and a.name == "rxe1" for a in host.applied)
    r.agent.trigger("netlink", "change eth7", touches=frozenset({"eth7", "ifindex:9"}))
    await r.advance(0.2)
    assert sum(isinstance(a, AddRxe) and a.name == "rxe1" for a in host.applied) == tries
    await r.stop()


@dataclass
class UndoingHost(FakeHost):
    """Each rxe add works, then something deletes the link again and the kernel says so
    (a remove event naming it), ``undo`` times."""

    undo: int = 0
    tell: Callable[[str], None] | None = None

    async def apply(self, action: Action) -> FakeResult:  # type: ignore[override]
        result = await FakeHost.apply(self, action)
        if isinstance(action, AddRxe) and self.undo > 0:
            self.undo -= 1
            del self.links[action.name]
            assert self.tell is not None
            self.tell(action.name)
        return result


def _removed(agent: Agent) -> Callable[[str], None]:
    def tell(name: str) -> None:
        agent.queue.put(
            Trigger("uevent", f"remove infiniband {name}", touches=frozenset({name}), rdma=True)
        )

    return tell


async def test_an_rxe_link_deleted_again_after_its_add_is_added_again(rig: RigFactory) -> None:
    # The link rdmad just made is deleted by hand before the follow-up pass looks: the
    # remove event says so, so the add is a new one, not "applied but no effect".
    host = UndoingHost(netdevs=["eth0"], undo=2)
    r = rig(desired(("rxe0", "eth0")), host=host)
    host.tell = _removed(r.agent)
    await r.start()
    await r.idle()
    assert host.links == {"rxe0": "eth0"}
    assert sum(isinstance(a, AddRxe) for a in host.applied) == 3
    o = r.agent.status.current.objects[0]
    assert o.state is ObjectState.CONVERGED and not o.last_error
    assert not [h for h in r.agent.status.history() if "old state" in repr(h)]  # never failed
    await r.stop()


@dataclass
class UnloadingHost(FakeHost):
    """rdma_rxe loads on modprobe; then an RDMA stack restart removes it (and its links)
    again and the module uevent says so, ``undo`` times."""

    modules: set[str] = field(default_factory=set)
    undo: int = 0
    tell: Callable[[str], None] | None = None

    async def observe(self) -> Observed:
        o = await FakeHost.observe(self)
        return replace(o, modules=ModulesObserved(frozenset(self.modules)))

    async def apply(self, action: Action) -> FakeResult:  # type: ignore[override]
        result = await FakeHost.apply(self, action)
        if isinstance(action, LoadModule):
            self.modules.add(action.module.replace("-", "_"))
        if isinstance(action, AddRxe) and self.undo > 0:
            self.undo -= 1
            self.modules.clear()
            self.links.clear()  # the links go with the module
            assert self.tell is not None
            self.tell(action.name)
        return result


async def test_a_module_removed_again_after_its_load_is_loaded_again(rig: RigFactory) -> None:
    # modprobe worked, then a stack restart removed the module before the follow-up pass
    # looked: the module event names it, so the load is a new one, not "no effect".
    host = UnloadingHost(netdevs=["eth0"], undo=1)
    r = rig(desired(("rxe0", "eth0")), host=host)

    def tell(link: str) -> None:
        for what, name in (("infiniband", link), ("module", "rdma_rxe")):
            r.agent.queue.put(
                Trigger(
                    "udev",
                    f"remove {what} {name}",
                    stale=True,
                    driver=what == "module",
                    touches=frozenset({name}),
                )
            )

    host.tell = tell
    await r.start()
    await r.idle()
    assert host.modules == {"rdma_rxe"} and host.links == {"rxe0": "eth0"}
    assert sum(isinstance(a, LoadModule) for a in host.applied) == 2
    assert sum(isinstance(a, AddRxe) for a in host.applied) == 2
    assert not [h for h in r.agent.status.history() if "old state" in repr(h)]  # never failed
    assert all(not o.last_error for o in r.agent.status.current.objects)
    await r.stop()


async def test_a_module_load_waits_until_module_removals_are_quiet(rig: RigFactory) -> None:
    # An operator unloads the RDMA stack by hand, one `modprobe -r` after the other:
    # rdmad must not load back, between two of them, what the next one removes.
    host = UnloadingHost(netdevs=["eth0"], modules={"rdma_rxe"}, links={"rxe0": "eth0"})
    r = rig(desired(("rxe0", "eth0")), host=host)
    await r.start()
    await r.idle()
    assert not any(isinstance(a, LoadModule) for a in host.applied)

    def removed(module: str) -> None:
        host.modules.discard(module)
        host.links.clear()
        r.agent.queue.put(
            Trigger(
                "udev",
                f"remove module {module}",
                stale=True,
                driver=True,
                touches=frozenset({module}),
            )
        )

    removed("rdma_rxe")
    for _ in range(4):  # removals go on for a while: nothing is loaded meanwhile
        await r.advance(MODULE_SETTLE * 0.6)
        assert not any(isinstance(a, LoadModule) for a in host.applied)
        removed("ib_uverbs")
    await r.advance(MODULE_SETTLE * 0.9)
    assert not any(isinstance(a, LoadModule) for a in host.applied)
    # Quiet for MODULE_SETTLE: the load (and the link) come, in a pass of their own.
    await r.advance(MODULE_SETTLE * 0.2)
    await until(lambda: "rxe0" in host.links, "rxe back after the removals settled")
    assert [a.module for a in host.applied if isinstance(a, LoadModule)] == ["rdma_rxe"]
    assert any(p.cause == "module-settle" for p in r.agent.passes)
    assert all(not o.last_error for o in r.agent.status.current.objects)
    assert not [h for h in r.agent.status.history() if h.event == "failed"]
    await r.stop()


async def test_a_kernel_that_keeps_undoing_an_add_is_a_failure_after_a_few(
    rig: RigFactory,
) -> None:
    host = UndoingHost(netdevs=["eth0"], undo=1000)
    r = rig(desired(("rxe0", "eth0")), host=host)
    host.tell = _removed(r.agent)
    await r.start()
    for _ in range(100):  # settle windows of fake time, until the failure
        if r.agent.status.current.objects[0].last_error:
            break
        await r.advance(0.1)
    # The first add, MAX_REDONE more on events, then the same add is a failure.
    assert sum(isinstance(a, AddRxe) for a in host.applied) == 1 + MAX_REDONE
    assert "still shows the old state" in (r.agent.status.current.objects[0].last_error or "")
    # Then backoff spaces the attempts (the next round comes after its retry delay).
    await r.stop()


def _rdma_removed(name: str) -> Trigger:
    """An RDMA device's kernel `remove` uevent, as the daemon's uevent source puts it."""
    return Trigger(
        "uevent", f"remove infiniband {name}", stale=True, touches=frozenset({name}),
        narrow=True, rdma=True, removed=True,
    )  # fmt: skip


async def test_an_rxe_link_the_kernel_removed_is_added_again_at_once(rig: RigFactory) -> None:
    """No wait after the kernel's `remove` uevent: the pass it starts (the leading edge)
    sends the add before any fake time passes (an add refused while the kernel still
    releases the name is the host's to send again, kernel.apply.host RXE_RELEASE_WAIT)."""
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    await r.idle()
    assert host.links == {"rxe0": "eth0"}
    del host.links["rxe0"]
    removed_at = r.clock.monotonic()
    adds = len(host.applied)
    r.agent.queue.put(_rdma_removed("rxe0"))
    await until(lambda: len(host.applied) > adds, "the add")
    assert isinstance(host.applied[-1], AddRxe)
    assert r.clock.monotonic() == removed_at  # no hold, no settle window
    assert host.links == {"rxe0": "eth0"}
    await r.stop()


async def test_news_that_come_while_a_narrow_pass_observes_are_taken_into_it(
    rig: RigFactory,
) -> None:
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9")), host=host).start()
    await r.idle()
    queue, passes = r.agent.queue, len(r.agent.passes)
    # A veth pair: the peer's news starts the pass, eth9's comes while it observes.
    later = [Trigger("netlink", "add eth9", narrow=True, link=(9, b"eth9"))]
    original = host.observe_changed

    async def observe_changed(
        rdma: bool, links: Mapping[int, bytes | None] | None = None
    ) -> Observed | None:
        if later:
            host.netdevs.append("eth9")
            queue.put(later.pop())
        return await original(rdma, links)

    host.observe_changed = observe_changed  # type: ignore[method-assign]
    number = queue.put(Trigger("netlink", "add eth8", narrow=True, link=(8, b"eth8")))
    await until(lambda: any(isinstance(a, AddRxe) for a in host.applied), "rxe added")
    assert host.news == [{8: b"eth8"}, {9: b"eth9"}]  # one pass, two reads of news
    assert len(r.agent.passes) == passes + 1 and r.agent.passes[-1].triggers == 2
    assert r.agent.status.current.answered >= number + 1
    await r.stop()


async def test_news_after_a_narrow_pass_observed_are_answered_right_after_it(
    rig: RigFactory,
) -> None:
    host = NarrowHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9")), host=host).start()
    await r.idle()
    queue = r.agent.queue
    during = [
        Trigger("netlink", "add eth5", narrow=True, link=(5, b"eth5")),  # news: no wait
        Trigger("udev", "add net eth5", narrow=True),  # no news: SOON after the pass
    ]
    planner = r.agent.planner

    def plan(d: Desired, o: Observed, s: PlanState) -> list[Action]:
        # The pass's own plan (not the one asked ahead for eth9: reconcile.reactions).
        if during and o.netdev("eth9") is None:
            queue.put(during.pop(0))  # announced after the pass observed
        return planner(d, o, s)

    r.agent.planner = plan
    queue.put(Trigger("netlink", "add eth4", narrow=True, link=(4, b"eth4")))
    await until(lambda: len(host.news) == 2, "the pass for the news that came during one")
    assert host.news == [{4: b"eth4"}, {5: b"eth5"}]
    await spin()
    assert len(host.news) == 2, "a narrow trigger without news waits for SOON"
    r.clock.advance(0.011)
    await until(lambda: len(host.news) == 3, "the pass SOON later")
    assert host.news[2] is None
    await r.stop()
