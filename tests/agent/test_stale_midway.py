"""An action dropped as stale after some of its writes ran (the host re-checks right
before each destructive write): those writes are in history, the stale drop names the
holder, and the object is planned again from a new observation."""

from __future__ import annotations

from dataclasses import dataclass

from rdmad.model import Action, AddRxe
from tests.agent.conftest import FakeHost, FakeResult, FakeWrite, RigFactory, desired

HOLDER = "pid 777 (ib_write_bw) holds /dev/infiniband/uverbs9"


@dataclass
class MidwayHost(FakeHost):
    """The first rxe add loads its module, then finds a holder at the re-check."""

    stale_once: bool = True

    async def apply(self, action: Action) -> FakeResult:
        if isinstance(action, AddRxe) and self.stale_once:
            self.stale_once = False
            self.applied.append(action)
            loaded = FakeWrite("module rdma_rxe", "not loaded", "loaded")
            return FakeResult((loaded,), note=f"stale: now in use: {HOLDER}", stale=True)
        return await FakeHost.apply(self, action)


async def test_writes_made_before_a_stale_drop_are_in_history_and_it_is_planned_again(
    rig: RigFactory,
) -> None:
    host = MidwayHost(netdevs=["eth0"])
    r = rig(desired(("rxe0", "eth0"), drift_interval="1h"), host=host)
    await r.start()
    await r.idle()
    history = [(h.event, h.what, h.reason, h.error) for h in r.agent.status.history()]
    applied = [h for h in history if h[0] == "applied"]
    assert applied[0][1] == "module rdma_rxe: not loaded -> loaded", history
    [stale] = [h for h in history if h[0] == "stale"]
    assert HOLDER in stale[2]
    assert [a.kind for a in host.applied] == ["add-rxe", "add-rxe"]  # planned again
    assert host.links == {"rxe0": "eth0"}
    await r.stop()
