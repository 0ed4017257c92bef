"""Reflexes: a pass at rest arms its reactions' rxe adds with a host whose event readers
send them (kernel.events.reflex); the next pass disarms them, and its gate decides each send."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from rdmad import daemon
from rdmad.agent.protocols import Reflexive
from rdmad.model import AddRxe
from rdmad.triggers import Trigger

from .conftest import Rig, RigFactory, desired, until
from .test_reactions import OrderHost, netdev_added, rdma_removed


@dataclass
class ReflexHost(OrderHost):
    """Records arming; ``fire`` does what the reflex does on an event: asks the gate
    and, if it says yes, makes the link (the kernel's part) before the agent hears."""

    armed: list[tuple[dict[str, list[str]], dict[str, list[str]]]] = field(default_factory=list)
    disarmed: int = 0
    gate: Callable[[AddRxe], bool] | None = None  # type: ignore[assignment]
    made: Callable[[AddRxe], None] | None = None
    on_netdev: dict[str, list[AddRxe]] = field(default_factory=dict)
    on_removed: dict[str, list[AddRxe]] = field(default_factory=dict)

    def arm_reflexes(
        self,
        on_netdev: Mapping[str, Sequence[AddRxe]],
        on_removed: Mapping[str, Sequence[AddRxe]],
        gate: Callable[[AddRxe], bool],
        made: Callable[[AddRxe], None],
    ) -> None:
        self.on_netdev = {k: list(v) for k, v in on_netdev.items()}
        self.on_removed = {k: list(v) for k, v in on_removed.items()}
        self.armed.append(
            (
                {k: [a.name for a in v] for k, v in on_netdev.items()},
                {k: [a.name for a in v] for k, v in on_removed.items()},
            )
        )
        self.gate, self.made = gate, made

    def disarm_reflexes(self) -> None:
        self.disarmed += 1
        self.gate = self.made = None

    async def reflexes_answered(self) -> None:
        self.steps.append("reflexes answered")

    def fire(self, adds: list[AddRxe]) -> bool:
        gate, made = self.gate, self.made
        assert gate is not None and made is not None, "not armed"
        sent = [a for a in adds if gate(a)]
        for a in sent:
            self.steps.append(f"reflex {a.describe()}")
            if a.netdev in self.netdevs:  # the kernel makes it, then the claim
                self.links[a.name] = a.netdev
                made(a)
        return bool(sent)


def claim_writes(r: Rig) -> list[set[str]]:
    """The names each claim written from now on holds (the state store's claim_rxe)."""
    store = r.agent.memory.state_store
    assert store is not None
    written: list[set[str]] = []
    real = store.claim_rxe

    def claim_rxe(boot_id: str, names: set[str]) -> str | None:
        written.append(set(names))
        return real(boot_id, names)

    store.claim_rxe = claim_rxe  # type: ignore[method-assign]
    return written


def test_reflexes_are_armed_on_the_real_host_and_never_in_a_dry_run() -> None:
    """The agent arms reflexes on a host that fits Reflexive (fastpath.py). The daemon's
    real host must (event readers put rxe links back before a pass); its dry-run host
    must not (its readers would make real links); and this fake stands for the real
    one: the same methods, parameters and awaitables as the protocol."""
    real, _ = daemon._make_host(dry_run=False)
    dry, _ = daemon._make_host(dry_run=True)
    assert isinstance(real, Reflexive)
    assert not isinstance(dry, Reflexive)
    for name in ("arm_reflexes", "disarm_reflexes", "reflexes_answered"):
        want = getattr(Reflexive, name)
        for host in (real, ReflexHost()):
            got = getattr(host, name)
            assert _params(got) == _params(want)[1:], (type(host).__name__, name)  # no self
            assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name


def _params(fn: Callable[..., object]) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


async def test_a_pass_at_rest_arms_the_adds_and_the_next_pass_disarms_them(
    rig: RigFactory,
) -> None:
    host = ReflexHost(netdevs=["eth0"])
    r = rig(desired(("rxe0", "eth9"), ("rxe1", "eth0"), drift_interval="1h"), host=host)
    await r.start()
    await r.idle()
    # rxe0 waits for eth9 to appear; rxe1 is there, put back if the kernel removes it.
    assert host.armed[-1] == ({"eth9": ["rxe0"]}, {"rxe1": ["rxe1"]})
    assert host.gate is not None
    arms, disarms = len(host.armed), host.disarmed
    r.agent.queue.put(Trigger("udev", "change net eth0", narrow=True, touches=frozenset({"eth0"})))
    await until(lambda: host.disarmed > disarms, "the next pass disarms")
    await r.idle()
    assert len(host.armed) > arms and host.gate is not None  # at rest again: armed again
    await r.stop()


async def test_an_add_the_reader_sent_is_claimed_once_made_and_its_pass_says_so(
    rig: RigFactory,
) -> None:
    host = ReflexHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host).start()
    await r.idle()
    host.netdevs.append("eth9")
    claims = claim_writes(r)
    assert host.fire(host.on_netdev["eth9"])  # the gate said yes, the kernel made it...
    assert "rxe0" in r.agent.state.managed_rxe and claims == [{"rxe0"}]  # ...claimed
    r.agent.queue.put(netdev_added("eth9", 9))  # then the trigger of the same news
    await until(lambda: "rdma link add rxe0 type rxe netdev eth9" in host.steps, "collected")
    await r.idle()
    # The pass first let the reader's add finish (its retries need the loop), then
    # applied the reaction (the real host collects the reader's outcome there).
    sent = host.steps.index("reflex rdma link add rxe0 type rxe netdev eth9")
    assert host.steps[sent + 1 : sent + 3] == [
        "reflexes answered",
        "rdma link add rxe0 type rxe netdev eth9",
    ]
    [entry] = [h for h in r.agent.status.history() if h.kind == "add-rxe"][-1:]
    assert entry.cause == "netlink (planned ahead, sent as the event was read)", entry
    assert host.links == {"rxe0": "eth9"}
    # The pass that collected it claims before "creating" too: nothing to write again.
    assert claims == [{"rxe0"}], claims
    await r.stop()


async def test_the_gate_refuses_when_something_pending_would_disarm_the_reaction(
    rig: RigFactory,
) -> None:
    host = ReflexHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host).start()
    await r.idle()
    gate = host.gate
    assert gate is not None
    [add] = host.on_removed["rxe0"]
    # A module came (a driver reload): the pass must look at everything first.
    r.agent.queue.put(Trigger("udev", "add module rdma_rxe", driver=True))
    assert not gate(add)
    await r.idle()
    gate = host.gate
    assert gate is not None
    [add] = host.on_removed["rxe0"]
    # The netdev the add names was removed meanwhile: stale.
    r.agent.queue.put(
        Trigger("netlink", "del eth0", stale=True, narrow=True, touches=frozenset({"eth0"}))
    )
    assert not gate(add)
    await r.idle()
    gate = host.gate
    assert gate is not None
    r.agent.stop()
    assert not gate(add)  # stopping
    await r.stop()


async def test_a_removed_link_sent_back_by_the_reader(rig: RigFactory) -> None:
    host = ReflexHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host).start()
    await r.idle()
    del host.links["rxe0"]
    assert host.fire(host.on_removed["rxe0"])
    r.agent.queue.put(rdma_removed("rxe0"))
    await r.idle()
    assert host.links == {"rxe0": "eth0"}
    [entry] = [h for h in r.agent.status.history() if h.kind == "add-rxe"][-1:]
    assert entry.cause.endswith("(planned ahead, sent as the event was read)"), entry
    await r.stop()


async def test_a_dry_run_never_arms(rig: RigFactory) -> None:
    host = ReflexHost(netdevs=["eth0"])
    r = rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=host, dry_run=True)
    await r.start()
    await r.idle()
    assert host.armed == [] and host.gate is None
    await r.stop()


async def test_an_add_the_reader_made_is_recorded_even_beside_its_own_devices_event(
    rig: RigFactory,
) -> None:
    """The reader's add can be made before the pass takes the batch: the new device's
    own `add` uevent is then in it, which disarms reactions; the add is applied
    (collected) all the same, so history and ownership say rdmad made it."""
    host = ReflexHost(netdevs=["eth0"])
    r = await rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host).start()
    await r.idle()
    adds = len([h for h in r.agent.status.history() if h.kind == "add-rxe"])
    del host.links["rxe0"]
    assert host.fire(host.on_removed["rxe0"])
    r.agent.queue.put(rdma_removed("rxe0"))
    came = Trigger("uevent", "add infiniband rxe0", narrow=True, rdma=True, announced=True)
    r.agent.queue.put(msgspec.structs.replace(came, touches=frozenset({"rxe0"})))
    await r.idle()
    entries = [h for h in r.agent.status.history() if h.kind == "add-rxe"]
    assert len(entries) == adds + 1, entries
    assert entries[-1].cause.endswith("(planned ahead, sent as the event was read)")
    assert r.agent.state.managed_rxe == {"rxe0"} and host.links == {"rxe0": "eth0"}
    await r.stop()


async def test_a_claim_is_written_again_after_a_write_that_failed(rig: RigFactory) -> None:
    """A link already claimed is written down again only while the last claims write
    failed (a full disk): what is on disk may then lack it."""
    r = await rig(desired(("rxe0", "eth9"), drift_interval="1h"), host=ReflexHost()).start()
    await r.idle()
    memory = r.agent.memory
    store = memory.state_store
    assert store is not None
    written: list[set[str]] = []
    failing = [True]

    def claim_rxe(boot_id: str, names: set[str]) -> str | None:
        written.append(set(names))
        return "state file x not written: No space left on device" if failing[0] else None

    store.claim_rxe = claim_rxe  # type: ignore[method-assign]
    memory.claim_rxe("rxe0")
    memory.claim_rxe("rxe0")  # the last write failed: again
    failing[0] = False
    memory.claim_rxe("rxe0")  # again, and it succeeds
    memory.claim_rxe("rxe0")  # on disk now: nothing to write
    assert written == [{"rxe0"}] * 3, written
    await r.stop()
