"""Status detail (rdmad.reconcile.detail): table tests of what each object, VF and
attribute shows for a node and its plan, then properties over generated nodes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from rdmad.model import (
    Desired,
    ObjectDetail,
    Observed,
    PfObserved,
    PlanState,
    RdmaLinkObserved,
    UnsupportedKey,
    Usage,
    VfSettings,
)
from rdmad.reconcile import plan
from rdmad.reconcile.detail import Describer, describe
from tests.support.records import replace
from tests.unit.test_reconcile import HELD, PF, converge, desired, node, pf, scenarios, sriov

OBJ = f"sriov pci={PF}"
RXE = {"name": "rxe0", "netdev": {"name": "eth0"}}


def flat(detail: ObjectDetail) -> dict[str, str]:
    """Every state in a detail by path: "numvfs", "vf1", "vf1.mac", "netdev"."""
    out = {a.name: a.state.value for a in detail.attributes}
    for v in detail.vfs:
        out[f"vf{v.vf}"] = v.state.value
        out.update({f"vf{v.vf}.{a.name}": a.state.value for a in v.attributes})
    return out


def with_settings(p: PfObserved, index: int, **values: Any) -> PfObserved:
    """``p`` with some settings of VF ``index`` changed (as if set by hand)."""
    vfs = tuple(
        replace(v, settings=replace(v.settings or VfSettings(), **values))
        if v.index == index
        else v
        for v in p.vfs
    )
    return replace(p, vfs=vfs)


def with_usage(p: PfObserved, index: int, usage: Usage) -> PfObserved:
    vfs = tuple(replace(v, usage=usage) if v.index == index else v for v in p.vfs)
    return replace(p, vfs=vfs)


MAC1, MAC2 = "02:00:00:00:00:01", "02:00:00:00:00:02"
RXE_LINK = RdmaLinkObserved("rxe0", "rxe", "eth0")
REFUSED = UnsupportedKey(PF, "mlx5_core", 0, "link_state", "enable", "EOPNOTSUPP")

# (id, desired, observed, plan state, expected states by path; paths not named are free)
CASES: list[tuple[str, Desired, Observed, PlanState, dict[str, dict[str, str]]]] = [
    (
        "converged node",
        desired(
            sriov=[sriov(4, {"index": 0, "mac": MAC1, "spoofchk": True}, {"index": 2})],
            rxe=[RXE],
        ),
        node(with_settings(pf(numvfs=4), 0, mac=MAC1), rdma=(RXE_LINK,)),
        PlanState(),
        {
            OBJ: {
                "numvfs": "converged",
                "vf0": "converged",
                "vf0.mac": "converged",
                "vf0.spoofchk": "converged",
                "vf1": "converged",
                "vf2": "converged",
                "vf3": "converged",
            },
            "rxe rxe0": {"netdev": "converged"},
        },
    ),
    (
        "pending MAC change on VF 1 only",
        desired(sriov=[sriov(4, {"index": 0, "mac": MAC1}, {"index": 1, "mac": MAC2})]),
        node(with_settings(pf(numvfs=4), 0, mac=MAC1)),
        PlanState(),
        {
            OBJ: {
                "numvfs": "converged",
                "vf0": "converged",
                "vf0.mac": "converged",
                "vf1": "pending",
                "vf1.mac": "pending",
                "vf2": "converged",
            }
        },
    ),
    (
        "numvfs lowering blocked by a VF in use",
        desired(sriov=[sriov(2, {"index": 0, "trust": False})]),
        node(with_usage(pf(numvfs=4), 3, HELD)),
        PlanState(),
        {
            OBJ: {
                "numvfs": "blocked",
                "vf0": "converged",
                "vf0.trust": "converged",
                "vf1": "converged",
                "vf3": "blocked",
            }
        },
    ),
    (
        "attribute the driver refused",
        desired(sriov=[sriov(2, {"index": 0, "link_state": "enable", "mac": MAC1})]),
        node(with_settings(pf(numvfs=2), 0, mac=MAC1)),
        PlanState(unsupported=frozenset({REFUSED})),
        {
            OBJ: {
                "numvfs": "converged",
                "vf0": "unsupported-by-driver",
                "vf0.link_state": "unsupported-by-driver",
                "vf0.mac": "converged",
            }
        },
    ),
    (
        "drift on a VF in use",
        desired(sriov=[sriov(2, {"index": 1, "mac": MAC2, "trust": True})]),
        node(with_usage(pf(numvfs=2), 1, HELD)),
        PlanState(),
        {
            OBJ: {
                "vf0": "converged",
                "vf1": "drift-on-in-use-vf",
                "vf1.mac": "drift-on-in-use-vf",
                "vf1.trust": "drift-on-in-use-vf",
            }
        },
    ),
    (
        "InfiniBand policy drift on a VF in use; its GUID's re-bind blocked",
        desired(
            sriov=[
                sriov(
                    2,
                    {"index": 0, "policy": "Down"},
                    {"index": 1, "policy": "Down", "node_guid": "00:11:22:33:44:55:66:77"},
                )
            ]
        ),
        node(with_usage(with_usage(pf(numvfs=2, ib=True), 0, HELD), 1, HELD)),
        PlanState(),
        {
            OBJ: {
                "vf0": "drift-on-in-use-vf",
                "vf0.policy": "drift-on-in-use-vf",
                "vf1": "blocked",
                "vf1.node_guid": "blocked",
                "vf1.policy": "drift-on-in-use-vf",
            }
        },
    ),
    (
        "PF missing",
        desired(sriov=[sriov(2, {"index": 0, "mac": MAC1})]),
        node(),
        PlanState(),
        {OBJ: {"numvfs": "pending", "vf0": "pending", "vf0.mac": "pending"}},
    ),
    (
        "declared VFs not created yet",
        desired(sriov=[sriov(4, {"index": 3, "mac": MAC1})]),
        node(pf(numvfs=0)),
        PlanState(),
        {OBJ: {"numvfs": "pending", "vf3": "pending", "vf3.mac": "pending"}},
    ),
    (
        "rebind of a VF in use blocked, the rest converged",
        desired(sriov=[sriov(2, {"index": 0, "driver": "vfio-pci", "spoofchk": True})]),
        node(with_usage(pf(numvfs=2), 0, HELD)),
        PlanState(),
        {
            OBJ: {
                "numvfs": "converged",
                "vf0": "blocked",
                "vf0.driver": "blocked",
                "vf0.spoofchk": "converged",
            }
        },
    ),
    (
        "driver bind pending on a free VF",
        desired(sriov=[sriov(2, {"index": 1, "driver": "vfio-pci"})]),
        node(pf(numvfs=2)),
        PlanState(),
        {OBJ: {"vf1": "pending", "vf1.driver": "pending", "vf0": "converged"}},
    ),
    (
        "GUIDs on a PF without InfiniBand controls",
        desired(sriov=[sriov(2, {"index": 0, "node_guid": "00:11:22:33:44:55:66:77"})]),
        node(pf(numvfs=2)),
        PlanState(),
        {OBJ: {"vf0": "blocked", "vf0.node_guid": "blocked"}},
    ),
    (
        "a VLAN without a protocol reads as 802.1Q when the kernel does not say",
        desired(sriov=[sriov(2, {"index": 0, "vlan": 100})]),
        node(with_settings(pf(numvfs=2), 0, vlan=100, vlan_proto=None)),
        PlanState(),
        {OBJ: {"vf0": "converged", "vf0.vlan": "converged", "vf0.vlan_proto": "converged"}},
    ),
    (
        "rxe link missing its netdev",
        desired(rxe=[{"name": "rxe0", "netdev": {"name": "eth9"}}]),
        node(),
        PlanState(),
        {"rxe rxe0": {"netdev": "pending"}},
    ),
    (
        "rxe link to create",
        desired(rxe=[RXE]),
        node(),
        PlanState(),
        {"rxe rxe0": {"netdev": "pending"}},
    ),
    (
        "undeclared rxe link rdmad made, held",
        desired(),
        node(rdma=(RdmaLinkObserved("old", "rxe", "veth1", usage=HELD),)),
        PlanState(frozenset({"old"})),
        {"rxe old": {"netdev": "blocked"}},
    ),
]


@pytest.mark.parametrize(("d", "o", "s", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_states(d: Desired, o: Observed, s: PlanState, want: dict[str, dict[str, str]]) -> None:
    details = describe(d, o, plan(d, o, s))
    for obj, states in want.items():
        got = flat(details[obj])
        assert {k: got.get(k) for k in states} == states, got
    json.dumps({obj: det.to_json() for obj, det in details.items()})


def test_converged_node_shows_desired_and_observed() -> None:
    d = desired(sriov=[sriov(4, {"index": 0, "mac": MAC1, "spoofchk": True})], rxe=[RXE])
    o = node(with_settings(pf(numvfs=4), 0, mac=MAC1), rdma=(RXE_LINK,))
    details = describe(d, o, plan(d, o, PlanState()))
    sr = details[OBJ]
    assert sr.desired == {
        "pf": f"pci={PF}",
        "numvfs": 4,
        "driver_guard": True,
        "in_use_drift": "report",
        "autoprobe": None,
        "eswitch": None,
        "owner": None,
    }
    assert sr.observed == {
        "pci": PF,
        "netdev": "ens1f0",
        "driver": "mlx5_core",
        "numvfs": 4,
        "totalvfs": 8,
        "autoprobe": True,
        "up": None,
        "guard": "unknown (the hook file was not read)",
        "managers": None,  # a hand-built snapshot: not looked at
    }
    assert [v.vf for v in sr.vfs] == [0, 1, 2, 3]  # declared and present, once each
    vf0 = sr.vfs[0]
    assert (vf0.pci, vf0.driver, vf0.usage, vf0.holders) == ("0000:3b:10.0", "vfdrv", "free", ())
    assert [(a.name, a.desired, a.observed) for a in vf0.attributes] == [
        ("mac", MAC1, MAC1),
        ("spoofchk", True, True),  # JSON booleans, not "on"
    ]
    assert sr.vfs[1].attributes == ()  # present, not declared
    rxe = details["rxe rxe0"]
    assert rxe.desired == {"name": "rxe0", "netdev": "netdev eth0"}
    assert rxe.observed == {
        "name": "rxe0",
        "netdev": "eth0",
        "usage": "free",
        "port_state": None,
        "gids": None,
    }
    netdev, serving = rxe.attributes
    assert (netdev.desired, netdev.observed, netdev.reason) == ("eth0", "eth0", "")
    assert (serving.name, serving.observed, serving.state.value) == ("serving", True, "converged")


def test_pending_mac_says_why_and_shows_both_values() -> None:
    d = desired(sriov=[sriov(4, {"index": 1, "mac": MAC2})])
    o = node(pf(numvfs=4))
    vf1 = describe(d, o, plan(d, o, PlanState()))[OBJ].vfs[1]
    [mac] = vf1.attributes
    assert (mac.desired, mac.observed) == (MAC2, "00:00:00:00:00:00")
    assert mac.reason == "restore declared settings of VF 1"
    assert vf1.reason == mac.reason


def test_blocked_vf_names_its_holder() -> None:
    d = desired(sriov=[sriov(2)])
    o = node(with_usage(pf(numvfs=4), 3, HELD))
    sr = describe(d, o, plan(d, o, PlanState()))[OBJ]
    vf3 = sr.vfs[3]
    assert vf3.usage == "in-use" and vf3.holders == HELD.holders
    assert HELD.holders[0] in vf3.reason and "numvfs 4 -> 2" in vf3.reason
    [numvfs] = sr.attributes
    assert (numvfs.desired, numvfs.observed, numvfs.reason) == (2, 4, vf3.reason)


def test_missing_pf_has_no_observed_values_and_says_why() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "mac": MAC1})])
    sr = describe(d, node(), plan(d, node(), PlanState()))[OBJ]
    assert sr.observed == {}
    [numvfs] = sr.attributes
    assert numvfs.observed is None and "is not present" in numvfs.reason
    [vf0] = sr.vfs
    assert (vf0.pci, vf0.reason) == (None, "not present")
    assert [(a.name, a.observed) for a in vf0.attributes] == [("mac", None)]


def test_rxe_with_unresolved_netdev_shows_the_reference() -> None:
    d = desired(rxe=[{"name": "rxe0", "netdev": {"mac": "52:54:00:00:99:99"}}])
    rxe = describe(d, node(), plan(d, node(), PlanState()))["rxe rxe0"]
    assert rxe.observed == {}
    [netdev] = rxe.attributes
    assert netdev.desired == "netdev with MAC 52:54:00:00:99:99"
    assert netdev.observed is None and "is not present" in netdev.reason


def test_rxe_with_resolved_netdev_shows_its_name() -> None:
    d = desired(rxe=[{"name": "rxe0", "netdev": {"pci": "0000:00:03.0"}}])
    rxe = describe(d, node(), plan(d, node(), PlanState()))["rxe rxe0"]
    [netdev] = rxe.attributes
    assert netdev.desired == "eth0" and netdev.reason == "declared rxe link is missing"


def test_undeclared_link_to_delete_gets_a_detail() -> None:
    o = node(rdma=(RdmaLinkObserved("old", "rxe", "veth1"),))
    det = describe(desired(), o, plan(desired(), o, PlanState(frozenset({"old"}))))["rxe old"]
    assert det.desired == {} and det.observed["netdev"] == "veth1"
    [netdev] = det.attributes
    assert netdev.state.value == "pending" and "no longer declared" in netdev.reason


def test_describer_answers_again_only_while_nothing_changed() -> None:
    d = desired(sriov=[sriov(4, {"index": 1, "mac": MAC2})])
    o = node(pf(numvfs=4))
    memo = Describer()
    first = memo(d, o, plan(d, o, PlanState()))
    again = node(pf(numvfs=4))  # a new observation, equal to the last
    assert again is not o and memo(d, again, plan(d, again, PlanState())) is first
    changed = node(with_settings(pf(numvfs=4), 1, mac=MAC2))
    now = memo(d, changed, plan(d, changed, PlanState()))
    assert now is not first and flat(now[OBJ])["vf1.mac"] == "converged"
    # A reloaded config (a new Desired, even if equal) is described afresh.
    d2 = desired(sriov=[sriov(4, {"index": 1, "mac": MAC2})])
    assert memo(d2, changed, plan(d2, changed, PlanState())) is not now
    assert memo(d2, changed, plan(d2, changed, PlanState())) == now


# --- properties ----------------------------------------------------------------------------

_NOT_ATTRS = {"index", "in_use_drift"}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_declared_attribute_once_and_empty_plan_is_converged(
    case: tuple[Desired, Observed, PlanState],
) -> None:
    d, o, s = case
    kernel, _ = converge(d, o, s)
    # As generated (plans of every kind) and converged (mostly empty plans).
    for observed in (o, kernel.observed):
        actions = plan(d, observed, s)
        details = describe(d, observed, actions)
        json.dumps({obj: det.to_json() for obj, det in details.items()})
        for spec in d.sriov:
            vfs = {v.vf: v for v in details[spec.obj].vfs}
            for vf_spec in spec.vf:
                names = [a.name for a in vfs[vf_spec.index].attributes]
                declared = {
                    k for k, v in msgspec.structs.asdict(vf_spec).items() if v is not None
                } - _NOT_ATTRS
                assert len(names) == len(set(names)), names
                # vlan_proto may be implied by a VLAN; nothing else is added.
                assert set(names) - declared <= {"vlan_proto"}, (names, declared)
                assert declared <= set(names), (names, declared)
        for obj, det in details.items():
            if any(a.obj == obj for a in actions):
                continue
            states = set(flat(det).values())
            assert states <= {"converged"}, (obj, flat(det))
