"""What the agent publishes per object beyond its state: the per-VF, per-attribute
detail, the last change applied and the errno of the last failure."""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass

from rdmad.model import Desired, ObjectState, Observed, PfObserved, Usage, Use
from rdmad.model.validation import validate
from rdmad.status import ObjectReport
from tests.support.records import replace
from tests.support.simkernel import make_vfs

from .conftest import FakeHost, RigFactory, desired

PF = "0000:3b:00.0"
HOLDER = "pid 4242 (qemu-system-x86) holds /dev/vfio/61"


@dataclass
class SriovHost(FakeHost):
    """The rxe fake with one SR-IOV PF beside it."""

    pf: PfObserved | None = None

    async def observe(self) -> Observed:
        base = await super().observe()
        return replace(base, pfs=(self.pf,) if self.pf is not None else ())


def pf_with(numvfs: int, held: int | None = None) -> PfObserved:
    base = PfObserved(PF, "mlx5_core", "ens1f0", 5, None, None, numvfs, 64)
    vfs = make_vfs(base, numvfs)
    if held is not None:
        vfs = tuple(
            replace(v, usage=Usage(Use.IN_USE, (HOLDER,))) if v.index == held else v for v in vfs
        )
    return replace(base, vfs=vfs)


def report(reports: tuple[ObjectReport, ...], obj: str) -> ObjectReport:
    return {o.obj: o for o in reports}[obj]


async def test_pass_fills_detail_and_last_change(rig: RigFactory) -> None:
    r = await rig(desired(("rxe0", "eth1"))).start()
    await r.idle()
    o = report(r.agent.status.current.objects, "rxe rxe0")
    assert o.state is ObjectState.CONVERGED
    assert o.detail is not None and o.detail.kind == "rxe"
    doc = json.loads(json.dumps(o.detail.to_json()))
    # The fake host reads neither the port's state nor its GIDs: nothing concluded.
    assert doc["observed"] == {
        "name": "rxe0",
        "netdev": "eth1",
        "usage": "free",
        "port_state": None,
        "gids": None,
    }
    assert doc["attributes"] == [
        {
            "name": "netdev",
            "desired": "eth1",
            "observed": "eth1",
            "state": "converged",
            "reason": "",
        },
        {
            "name": "serving",
            "desired": True,
            "observed": True,
            "state": "converged",
            "reason": "",
        },
    ]
    assert o.last_change is not None
    assert o.last_change["what"] == "rdma link add rxe0 type rxe netdev eth1"
    assert o.last_change["reason"] == "declared rxe link is missing"
    assert o.last_change["cause"] == r.agent.passes[0].cause
    assert o.last_change["at"] == r.agent.status.history()[-1].at
    assert o.errno is None
    await r.stop()


async def test_failed_write_errno_reaches_the_report(rig: RigFactory) -> None:
    host = FakeHost(fail={"rxe0": errno.EBUSY})
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    await r.idle()
    o = report(r.agent.status.current.objects, "rxe rxe0")
    assert o.state is ObjectState.DEGRADED
    assert o.errno == errno.EBUSY and "EBUSY" in (o.last_error or "")
    assert o.last_change is None  # nothing was ever applied to it
    # Detail still says what is declared and what the plan wants.
    assert o.detail is not None
    [netdev] = o.detail.attributes
    assert (netdev.desired, netdev.observed, netdev.state) == ("eth0", None, ObjectState.PENDING)
    assert r.agent.memory.state.last_errors["rxe rxe0"]["errno"] == errno.EBUSY
    # Recovery clears it.
    del host.fail["rxe0"]
    await r.advance(10.0, step=0.5)
    await r.idle()
    o = report(r.agent.status.current.objects, "rxe rxe0")
    assert (o.state, o.errno) == (ObjectState.CONVERGED, None)
    await r.stop()


async def test_sriov_detail_names_the_vf_in_use_and_its_holder(rig: RigFactory) -> None:
    host = SriovHost(pf=pf_with(4, held=3))
    d = validate(Desired, {"sriov": [{"pf": {"pci": PF}, "numvfs": 2}]})
    r = await rig(d, host=host).start()
    await r.idle()
    o = report(r.agent.status.current.objects, f"sriov pci={PF}")
    assert o.state is ObjectState.BLOCKED
    assert o.detail is not None
    doc = json.loads(json.dumps(o.detail.to_json()))
    assert [v["vf"] for v in doc["vfs"]] == [0, 1, 2, 3]
    vf3 = doc["vfs"][3]
    assert (vf3["state"], vf3["usage"], vf3["holders"]) == ("blocked", "in-use", [HOLDER])
    [numvfs] = doc["attributes"]
    assert (numvfs["desired"], numvfs["observed"], numvfs["state"]) == (2, 4, "blocked")
    assert HOLDER in numvfs["reason"] and numvfs["reason"] == vf3["reason"]
    await r.stop()


async def test_sixty_four_vfs_all_listed_and_converged(rig: RigFactory) -> None:
    host = SriovHost(pf=pf_with(64))
    vfs = [{"index": i, "spoofchk": True, "trust": False} for i in range(64)]
    d = validate(Desired, {"sriov": [{"pf": {"pci": PF}, "numvfs": 64, "vf": vfs}]})
    r = await rig(d, host=host).start()
    await r.idle()
    o = report(r.agent.status.current.objects, f"sriov pci={PF}")
    assert o.state is ObjectState.CONVERGED and o.detail is not None
    assert len(o.detail.vfs) == 64
    assert {a.state for v in o.detail.vfs for a in v.attributes} == {ObjectState.CONVERGED}
    assert host.applied == []  # nothing to do: detail is read from the plan, never applied
    await r.stop()
