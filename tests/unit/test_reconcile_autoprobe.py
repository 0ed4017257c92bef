"""plan() for [[sriov]] autoprobe: sriov_drivers_autoprobe written before the VFs are
made (it decides whether a driver takes them), never held back by a VF in use (VFs
that exist keep their driver), refused where the PF has no such file, unknown (and the
VFs held back) where it cannot be read; status and snapshot."""

from __future__ import annotations

from rdmad.model import Blocked, Desired, ObjectState, PlanState, SetAutoprobe, SetNumVfs
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from rdmad.reconcile.detail import describe
from rdmad.snapshot import snapshot
from tests.support.records import replace
from tests.unit.test_reconcile import HELD, PF, node, pf


def desired(numvfs: int, autoprobe: bool | None) -> Desired:
    entry: dict[str, object] = {"pf": {"pci": PF}, "numvfs": numvfs}
    if autoprobe is not None:
        entry["autoprobe"] = autoprobe
    return validate(Desired, {"sriov": [entry]})


def test_autoprobe_goes_before_the_vfs_are_made() -> None:
    actions = plan(desired(2, False), node(pf(numvfs=0)), PlanState())
    assert [type(a) for a in actions][:2] == [SetAutoprobe, SetNumVfs]
    first = actions[0]
    assert isinstance(first, SetAutoprobe) and (first.old, first.new) == (True, False)
    assert first.describe() == f"{PF}: sriov_drivers_autoprobe 1 -> 0"


def test_autoprobe_alone_with_vfs_present_and_unset_untouched() -> None:
    actions = plan(desired(4, False), node(pf(numvfs=4)), PlanState())
    assert [type(a) for a in actions] == [SetAutoprobe]
    assert plan(desired(4, None), node(pf(numvfs=4)), PlanState()) == []
    as_declared = replace(pf(numvfs=4), drivers_autoprobe=False)
    assert plan(desired(4, False), node(as_declared), PlanState()) == []


def test_a_pf_without_the_file_is_blocked_not_written() -> None:
    no_file = replace(pf(numvfs=4), drivers_autoprobe=None)
    (blocked,) = plan(desired(4, False), node(no_file), PlanState())
    assert isinstance(blocked, Blocked) and "no sriov_drivers_autoprobe" in blocked.reason


def test_a_vf_in_use_never_holds_autoprobe_back() -> None:
    # Autoprobe changes nothing for VFs that exist: written with a VM on VF 1.
    held = pf(numvfs=4, usage={1: HELD})
    assert held.vfs[1].usage.busy  # control: the VF is in use
    [action] = plan(desired(4, False), node(held), PlanState())
    assert isinstance(action, SetAutoprobe)


def test_an_unreadable_autoprobe_holds_the_vfs_back() -> None:
    # EIO is not "no such file": VFs made now might be bound by the PF's VF driver first.
    unread = "cannot read /sys/bus/pci/devices/0000:3b:00.0/sriov_drivers_autoprobe: EIO"
    p = replace(pf(numvfs=0), autoprobe_unread=unread)
    actions = plan(desired(2, False), node(p), PlanState())
    assert not any(isinstance(a, SetAutoprobe | SetNumVfs) for a in actions)
    reasons = [a.reason for a in actions if isinstance(a, Blocked)]
    assert f"sriov_drivers_autoprobe is unknown: {unread}" in reasons
    assert "numvfs 0 -> 2 waits until sriov_drivers_autoprobe can be read" in reasons
    # Not declared: the file is not this object's business.
    assert [type(a) for a in plan(desired(2, None), node(p), PlanState())][:1] == [SetNumVfs]


def test_status_and_snapshot() -> None:
    o = node(pf(numvfs=4))
    d = desired(4, False)
    detail = describe(d, o, plan(d, o, PlanState()))[f"sriov pci={PF}"]
    (attr,) = [a for a in detail.attributes if a.name == "autoprobe"]
    assert (attr.desired, attr.observed, attr.state) == (False, True, ObjectState.PENDING)
    off = node(replace(pf(numvfs=4), drivers_autoprobe=False))
    assert "autoprobe = false" in snapshot(off)
    assert "autoprobe" not in snapshot(o)
