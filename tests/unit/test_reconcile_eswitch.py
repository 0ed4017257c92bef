"""plan() for [[sriov]] eswitch: the mode (and its inline and encap modes) set before the
VFs are made; a mode change under VFs only while every one is known to be free;
unknown is never acted on; a PF without an eSwitch and a refused option are
unsupported-by-driver, not retried; status, snapshot and the writes it stands for."""

from __future__ import annotations

import pytest

from rdmad.kernel.apply.writes import Op, planned_writes
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import (
    PF_ATTR,
    Blocked,
    Desired,
    EswitchObserved,
    ObjectState,
    PfObserved,
    PlanState,
    SetEswitch,
    SetNumVfs,
    SetVfSettings,
    Unsupported,
    UnsupportedKey,
    Usage,
    Use,
)
from rdmad.model.validation import SpecError, validate
from rdmad.reconcile import plan
from rdmad.reconcile.detail import describe
from rdmad.snapshot import snapshot
from tests.support.records import replace
from tests.unit.test_reconcile import HELD, PF, UNKNOWN, node, pf
from tests.unit.test_snapshot import parsed

LEGACY = EswitchObserved("legacy", "none", "basic")
SWITCHDEV = EswitchObserved("switchdev", "none", "basic")


def desired(numvfs: int, eswitch: dict[str, str] | None, **vf0: object) -> Desired:
    entry: dict[str, object] = {"pf": {"pci": PF}, "numvfs": numvfs}
    if eswitch is not None:
        entry["eswitch"] = eswitch
    if vf0:
        entry["vf"] = [{"index": 0, **vf0}]
    return validate(Desired, {"sriov": [entry]})


def with_eswitch(p: PfObserved, seen: EswitchObserved | None) -> PfObserved:
    return replace(p, eswitch=seen)


def test_mode_first_then_the_vfs_then_their_settings() -> None:
    d = desired(2, {"mode": "switchdev"}, mac="02:00:00:00:00:01")
    actions = plan(d, node(with_eswitch(pf(numvfs=0), LEGACY)), PlanState())
    assert [type(a) for a in actions] == [SetEswitch, SetNumVfs, SetVfSettings]
    first = actions[0]
    assert isinstance(first, SetEswitch)
    assert first.changes == (("mode", "legacy", "switchdev"),)
    assert first.describe() == f"{PF}: eswitch mode legacy -> switchdev"
    assert first.reason == "eswitch mode legacy -> switchdev (before the VFs)"


def test_only_the_options_that_differ_are_sent_each_its_own_write() -> None:
    d = desired(0, {"mode": "switchdev", "inline_mode": "transport", "encap_mode": "basic"})
    (action,) = plan(d, node(with_eswitch(pf(numvfs=0), LEGACY)), PlanState())
    assert isinstance(action, SetEswitch)
    assert action.changes == (("mode", "legacy", "switchdev"), ("inline_mode", "none", "transport"))
    writes = planned_writes(action, Sysfs("/nonexistent"))
    assert [(w.op, w.value, w.destructive) for w in writes] == [
        (Op.ESWITCH, "mode=switchdev", True),  # re-checked against VF use right before
        (Op.ESWITCH, "inline_mode=transport", False),
    ]
    as_declared = EswitchObserved("switchdev", "transport", "basic")
    assert plan(d, node(with_eswitch(pf(numvfs=0), as_declared)), PlanState()) == []


def test_unset_is_left_alone_whatever_the_pf_shows() -> None:
    for seen in (LEGACY, SWITCHDEV, EswitchObserved(unread="EIO"), None):
        assert plan(desired(0, None), node(with_eswitch(pf(numvfs=0), seen)), PlanState()) == []


@pytest.mark.parametrize("usage", [HELD, UNKNOWN], ids=["in-use", "unknown"])
def test_a_mode_change_under_vfs_not_free_is_blocked_naming_them(usage: object) -> None:
    p = with_eswitch(pf(numvfs=2, usage={1: usage}), LEGACY)  # type: ignore[dict-item]
    actions = plan(desired(2, {"mode": "switchdev"}), node(p), PlanState())
    blocked = [a for a in actions if isinstance(a, Blocked)]
    assert not any(isinstance(a, SetEswitch) for a in actions)
    assert len(blocked) == 1 and blocked[0].vfs == (1,)
    assert "would re-create the vports of VFs in use: VF 1" in blocked[0].reason
    assert usage.holders[0] in blocked[0].reason  # type: ignore[attr-defined]


def test_a_representor_in_use_blocks_a_mode_change_and_a_numvfs_change() -> None:
    # The representors go with the vports: an OVS port or an rxe link on one holds them.
    ovs = Usage(Use.IN_USE, ("representor pf0vf1 is a port of ovs-system",))
    p = with_eswitch(pf(numvfs=2), SWITCHDEV)
    vfs = tuple(
        replace(v, representor=f"pf0vf{v.index}", representor_usage=ovs) if v.index == 1 else v
        for v in p.vfs
    )
    p = replace(p, vfs=vfs)
    actions = plan(desired(2, {"mode": "legacy"}), node(p), PlanState())
    [blocked] = [a for a in actions if isinstance(a, Blocked)]
    assert not any(isinstance(a, SetEswitch) for a in actions)
    assert blocked.vfs == (1,)
    assert f"VF 1 ({p.vfs[1].pci}): representor pf0vf1 is a port of ovs-system" in blocked.reason
    actions = plan(desired(4, None), node(p), PlanState())
    [blocked] = [a for a in actions if isinstance(a, Blocked)]
    assert not any(isinstance(a, SetNumVfs) for a in actions)
    assert "would destroy VFs in use" in blocked.reason and "ovs-system" in blocked.reason


def test_a_mode_change_under_free_vfs_goes_and_vfs_not_all_visible_block() -> None:
    free = with_eswitch(pf(numvfs=2), LEGACY)
    (action,) = plan(desired(2, {"mode": "switchdev"}), node(free), PlanState())
    assert isinstance(action, SetEswitch) and action.numvfs == 2
    hidden = replace(free, vfs=free.vfs[:1])
    actions = plan(desired(2, {"mode": "switchdev"}), node(hidden), PlanState())
    assert any(isinstance(a, Blocked) and "1 of 2 VFs are visible" in a.reason for a in actions)
    assert not any(isinstance(a, SetEswitch) for a in actions)


def test_inline_mode_alone_is_not_held_back_by_vfs_in_use() -> None:
    p = with_eswitch(pf(numvfs=2, usage={0: HELD}), SWITCHDEV)
    d = desired(2, {"mode": "switchdev", "inline_mode": "link"})
    (action,) = plan(d, node(p), PlanState())
    assert isinstance(action, SetEswitch) and action.changes == (("inline_mode", "none", "link"),)


def test_unknown_is_never_acted_on() -> None:
    unread = EswitchObserved(unread="read the eSwitch on pci/x: Cannot allocate memory")
    (blocked,) = plan(
        desired(0, {"mode": "switchdev"}), node(with_eswitch(pf(), unread)), PlanState()
    )
    assert isinstance(blocked, Blocked) and "could not be read" in blocked.reason
    (blocked,) = plan(desired(0, {"mode": "switchdev"}), node(pf()), PlanState())
    assert isinstance(blocked, Blocked) and "read over devlink" in blocked.reason


def test_no_eswitch_and_a_refused_option_are_unsupported_not_retried() -> None:
    none = EswitchObserved(absent="igb registers no devlink instance for 0000:01:00.0")
    (note,) = plan(desired(0, {"mode": "switchdev"}), node(with_eswitch(pf(), none)), PlanState())
    assert isinstance(note, Unsupported) and note.vf == PF_ATTR
    assert "has no eSwitch: igb registers no devlink instance" in note.reason
    # Without words for why, "has no eSwitch" is said once (it read "... has no eSwitch:
    # no eSwitch").
    (note,) = plan(
        desired(0, {"mode": "switchdev"}),
        node(with_eswitch(pf(), EswitchObserved())),
        PlanState(),
    )
    assert isinstance(note, Unsupported) and note.reason == f"{PF} has no eSwitch"

    refused = UnsupportedKey(
        PF, "mlx5_core", PF_ATTR, "eswitch.inline_mode", "transport", "EOPNOTSUPP"
    )
    d = desired(0, {"mode": "switchdev", "inline_mode": "transport"})
    seen = node(with_eswitch(pf(), LEGACY))
    actions = plan(d, seen, PlanState(unsupported=frozenset({refused})))
    assert [type(a) for a in actions] == [Unsupported, SetEswitch]
    assert actions[1].changes == (("mode", "legacy", "switchdev"),)  # type: ignore[attr-defined]
    detail = describe(d, seen, actions)[f"sriov pci={PF}"]
    states = {a.name: a.state for a in detail.attributes}
    assert states["eswitch.inline_mode"] is ObjectState.UNSUPPORTED
    assert states["eswitch.mode"] is ObjectState.PENDING


def test_status_shows_declared_seen_and_representors() -> None:
    p = with_eswitch(pf(numvfs=2), SWITCHDEV)
    p = replace(p, vfs=tuple(replace(v, representor=f"eth{v.index}r") for v in p.vfs))
    d = desired(2, {"mode": "switchdev"})
    o = node(p)
    detail = describe(d, o, plan(d, o, PlanState()))[f"sriov pci={PF}"]
    (mode,) = [a for a in detail.attributes if a.name == "eswitch.mode"]
    assert (mode.desired, mode.observed, mode.state) == (
        "switchdev",
        "switchdev",
        ObjectState.CONVERGED,
    )
    assert detail.desired["eswitch"] == {"mode": "switchdev"}
    assert detail.observed["eswitch"] == {
        "mode": "switchdev",
        "inline_mode": "none",
        "encap_mode": "basic",
    }
    assert detail.observed["representors"] == {"0": "eth0r", "1": "eth1r"}


def test_snapshot_keeps_switchdev_only_and_plans_nothing() -> None:
    live = node(with_eswitch(pf(numvfs=2), SWITCHDEV))
    text = snapshot(live)
    assert 'eswitch = { mode = "switchdev" }' in text
    assert plan(parsed(text), live, PlanState()) == []
    for seen in (LEGACY, EswitchObserved(absent="none"), None):
        assert "eswitch" not in snapshot(node(with_eswitch(pf(numvfs=2), seen)))


def test_bad_eswitch_config_is_refused_with_its_key() -> None:
    with pytest.raises(SpecError) as err:
        desired(0, {"mode": "offload"})
    assert "eswitch" in str(err.value) and "mode" in str(err.value)
    with pytest.raises(SpecError):
        desired(0, {"inline_mode": "link"})  # the mode is required
