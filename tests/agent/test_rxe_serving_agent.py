"""The agent and rxe links that cannot serve yet: one look again for what the kernel
changes without an event (GIDs), address changes of that netdev listened to, and idle
otherwise."""

from __future__ import annotations

from dataclasses import dataclass, field

from rdmad.model import ModulesObserved, NetdevObserved, Observed, RdmaLinkObserved
from rdmad.reconcile.rxe import GID_RECHECK
from rdmad.triggers import Trigger
from tests.agent.conftest import FakeHost, Rig, RigFactory, desired, until

LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"
IPV4 = "0000:0000:0000:0000:0000:ffff:0a4d:0001"


@dataclass
class GidHost(FakeHost):
    """Links whose GIDs the test controls: the kernel's work queue, done when it says."""

    gids: dict[str, tuple[str, ...]] = field(default_factory=dict)

    async def observe(self) -> Observed:
        self.observes += 1
        if self.on_observe is not None:
            self.on_observe()
        return Observed(
            netdevs=tuple(NetdevObserved(n, i + 1) for i, n in enumerate(self.netdevs)),
            rdma_links=tuple(
                RdmaLinkObserved(
                    k,
                    "rxe",
                    v,
                    netdev_ifindex=self.netdevs.index(v) + 1,
                    port_state="ACTIVE",
                    gids=self.gids.get(k, (LINK_LOCAL,)),
                )
                for k, v in sorted(self.links.items())
            ),
            modules=ModulesObserved(frozenset({"rdma_rxe"})),
        )


async def looked_at_again(rig: RigFactory, host: GidHost) -> Rig:
    """rdmad started with rxe0 on eth0, whose address GID never comes: created, READY=1
    sent, looked at once more after the delay."""
    r = rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host)
    await r.start()
    await r.idle()
    await r.advance(GID_RECHECK + 0.01)
    await until(lambda: r.notes.count("READY=1") == 1, "READY=1")
    await until(lambda: r.agent.passes[-1].cause == "recheck", "the look again")
    return r


def state_of(rig_: object, obj: str) -> str:
    status = rig_.agent.status.current  # type: ignore[attr-defined]
    return next(o.state.value for o in status.objects if o.obj == obj)


async def test_a_gid_the_kernel_makes_late_is_seen_by_the_look_again(rig: RigFactory) -> None:
    """The kernel makes an added address's GID from a work queue, with no event: the
    pass that found the link without one looks again once, and sees it converged."""
    host = GidHost()
    seen: list[int] = []

    def kernel_work() -> None:
        # The address GID is there from the second look at the link on.
        if "rxe0" in host.links:
            seen.append(host.observes)
            if len(seen) >= 2:
                host.gids["rxe0"] = (LINK_LOCAL, IPV4)

    host.on_observe = kernel_work
    r = rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host)
    await r.start()
    await r.idle()
    causes = [p.cause for p in r.agent.passes]
    assert causes[0] == "first-start" and causes[-1] == "recheck", causes
    assert causes.count("recheck") == 1
    assert state_of(r, "rxe rxe0") == "converged"
    # READY=1 did not wait for it (a new link's GIDs are there when the add returns).
    [ready] = [n for n in r.notes.sent if n.startswith("READY=1")]
    assert "cannot carry routed traffic" in ready, ready
    await r.stop()


async def test_a_link_that_never_gets_a_gid_costs_one_look_again_then_rdmad_is_idle(
    rig: RigFactory,
) -> None:
    host = GidHost()
    r = await looked_at_again(rig, host)
    passes = len(r.agent.passes)
    observes = host.observes
    await r.advance(600, step=10)  # ten minutes of fake time, drift every hour
    assert (len(r.agent.passes), host.observes) == (passes, observes)
    assert state_of(r, "rxe rxe0") == "pending"  # still says why, without polling
    await r.stop()


async def test_an_address_change_of_that_netdev_starts_a_pass_others_do_not(
    rig: RigFactory,
) -> None:
    host = GidHost()
    r = await looked_at_again(rig, host)
    queue = r.agent.queue
    assert queue.address_watch == frozenset({1})  # eth0
    passes = len(r.agent.passes)
    queue.put(Trigger("netlink", "address of eth1", narrow=True, address=2))
    await r.idle()
    assert len(r.agent.passes) == passes  # not eth0: dropped
    host.gids["rxe0"] = (LINK_LOCAL, IPV4)
    queue.put(Trigger("netlink", "address of eth0", narrow=True, address=1))
    await until(lambda: state_of(r, "rxe rxe0") == "converged", "the pass the address started")
    assert queue.address_watch == frozenset()  # nothing waits for a GID any more
    await r.stop()
