"""plan(): table tests for each rule, then properties over generated nodes."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmad.model import (
    AddRxe,
    BindVfDriver,
    Blocked,
    DeleteRxe,
    Desired,
    IbVfSettings,
    InUseDrift,
    LoadModule,
    ModulesObserved,
    NetdevObserved,
    Observed,
    PfObserved,
    PlanState,
    RdmaLinkObserved,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetVfSettings,
    Unsupported,
    UnsupportedKey,
    Usage,
    Use,
    Waiting,
    summarize,
)
from rdmad.model.validation import validate
from rdmad.reconcile import declared_objects, plan
from tests.support.records import replace
from tests.support.simkernel import SimKernel, make_vfs

PF = "0000:3b:00.0"
HELD = Usage(Use.IN_USE, ("pid 4242 (qemu-system-x86) holds /dev/vfio/61",))
UNKNOWN = Usage(
    Use.UNKNOWN, ("bound to mlx5_core but its netdev is not in this network namespace",)
)


def desired(**doc: object) -> Desired:
    return validate(Desired, doc)


def pf(
    numvfs: int = 0,
    totalvfs: int = 8,
    ib: bool = False,
    netdev: str | None = "ens1f0",
    usage: dict[int, Usage] | None = None,
) -> PfObserved:
    base = PfObserved(
        pci=PF,
        driver="mlx5_core",
        netdev=netdev,
        ifindex=5,
        mac="52:54:00:00:00:01",
        perm_mac="52:54:00:00:00:01",
        numvfs=numvfs,
        totalvfs=totalvfs,
        ib_device="mlx5_0" if ib else None,
    )
    vfs = make_vfs(base, numvfs)
    if usage:
        vfs = tuple(replace(v, usage=usage.get(v.index, v.usage)) for v in vfs)
    return replace(base, vfs=vfs)


def node(
    *pfs: PfObserved,
    rdma: tuple[RdmaLinkObserved, ...] = (),
    modules: frozenset[str] = frozenset({"rdma_rxe"}),
    disabled: bool = False,
) -> Observed:
    return Observed(
        netdevs=(
            NetdevObserved(
                "eth0", 2, "52:54:00:ab:cd:ef", "52:54:00:ab:cd:ef", "0000:00:03.0", True
            ),
            NetdevObserved("veth1", 7, "ae:00:00:00:00:01", None, None, False),
        ),
        pfs=pfs,
        rdma_links=rdma,
        modules=ModulesObserved(modules, support="disabled" if disabled else "loadable"),
    )


def sriov(
    numvfs: int, *vfs: dict[str, object], ref: dict[str, str] | None = None
) -> dict[str, object]:
    return {"pf": ref or {"pci": PF}, "numvfs": numvfs, "vf": list(vfs)}


# --- SR-IOV rules ------------------------------------------------------------------------


def test_converged_node_plans_nothing() -> None:
    d = desired(sriov=[sriov(4, {"index": 0, "spoofchk": True})])
    assert plan(d, node(pf(numvfs=4)), PlanState()) == []


def test_numvfs_from_zero_is_one_write() -> None:
    [a] = plan(desired(sriov=[sriov(4)]), node(pf(numvfs=0)), PlanState())
    assert isinstance(a, SetNumVfs) and (a.old, a.new) == (0, 4)
    assert a.reason == "restore 4 VFs"


@pytest.mark.parametrize(("old", "new"), [(4, 8), (4, 2)])
def test_nonzero_change_goes_through_zero(old: int, new: int) -> None:
    actions = plan(desired(sriov=[sriov(new)]), node(pf(numvfs=old)), PlanState())
    assert [(a.old, a.new) for a in actions if isinstance(a, SetNumVfs)] == [(old, 0), (0, new)]
    assert "must pass through 0" in actions[0].reason


@pytest.mark.parametrize("usage", [HELD, UNKNOWN])
def test_count_change_blocked_while_a_vf_is_used(usage: Usage) -> None:
    actions = plan(desired(sriov=[sriov(0)]), node(pf(numvfs=4, usage={1: usage})), PlanState())
    [a] = actions
    assert isinstance(a, Blocked)
    assert "VF 1" in a.reason and usage.holders[0] in a.reason


def test_count_change_blocked_when_some_vfs_are_invisible() -> None:
    p = pf(numvfs=4)
    p = replace(p, vfs=p.vfs[:2])
    [a] = plan(desired(sriov=[sriov(2)]), node(p), PlanState())
    assert isinstance(a, Blocked) and "unknown" in a.reason


def test_numvfs_above_totalvfs_is_blocked() -> None:
    [a] = plan(desired(sriov=[sriov(9)]), node(pf(totalvfs=7)), PlanState())
    assert isinstance(a, Blocked) and "exceeds sriov_totalvfs 7" in a.reason


def test_pf_brought_up_first_for_drivers_that_need_it() -> None:
    p = replace(pf(numvfs=0), driver="bnxt_en", operstate_up=False)
    actions = plan(desired(sriov=[sriov(4)]), node(p), PlanState())
    assert [type(a) for a in actions] == [SetLinkUp, SetNumVfs]
    assert actions[0].describe() == "ip link set ens1f0 up"
    # Up already, or a driver that does not need it: the count alone.
    for other in (replace(p, operstate_up=True), replace(p, driver="ice")):
        assert [type(a) for a in plan(desired(sriov=[sriov(4)]), node(other), PlanState())] == [
            SetNumVfs
        ]


def test_a_pf_udev_has_not_named_yet_is_not_set_up() -> None:
    # Up, the kernel refuses udev's rename (EBUSY): wait for udev's event instead.
    p = replace(pf(numvfs=0), driver="bnxt_en", operstate_up=False, udev_pending=True)
    [a] = plan(desired(sriov=[sriov(4)]), node(p), PlanState())
    assert isinstance(a, Waiting)
    assert "udev has not named ens1f0 yet" in a.reason and not a.changes_kernel
    # Named: set up as before.
    named = replace(p, udev_pending=False)
    assert [type(a) for a in plan(desired(sriov=[sriov(4)]), node(named), PlanState())] == [
        SetLinkUp,
        SetNumVfs,
    ]


def test_a_pf_whose_udev_state_is_unknown_waits_and_says_why() -> None:
    """/run/udev could not be read: unknown waits as "not yet", in words of its own (an
    unreadable path, not a boot in progress), naming the path."""
    unbound = replace(pf(numvfs=0), driver=None, udev_pending=True, udev_unread="/run/udev/control")
    [a] = plan(desired(sriov=[sriov(4)]), node(unbound), PlanState())
    assert isinstance(a, Waiting) and not a.changes_kernel
    assert a.reason == (
        "0000:3b:00.0 has no driver bound, and whether udev has processed it is unknown "
        "(/run/udev/control could not be read): waiting as if it had not"
    )
    down = replace(
        pf(numvfs=0), driver="bnxt_en", operstate_up=False, udev_pending=True,
        udev_unread="/run/udev/data/n7",
    )  # fmt: skip
    [a] = plan(desired(sriov=[sriov(4)]), node(down), PlanState())
    assert isinstance(a, Waiting) and not a.changes_kernel
    assert "whether udev has named ens1f0 is unknown (/run/udev/data/n7 could not be read)" in (
        a.reason
    )


def test_pf_without_driver_waits_for_it() -> None:
    p = replace(pf(numvfs=0), driver=None)
    [a] = plan(desired(sriov=[sriov(4)]), node(p), PlanState())
    assert isinstance(a, Waiting) and "no driver bound" in a.reason


def test_missing_pf_waits() -> None:
    [a] = plan(desired(sriov=[sriov(2, ref={"pci": "0000:99:00.0"})]), node(pf()), PlanState())
    assert isinstance(a, Waiting) and "0000:99:00.0" in a.reason


@pytest.mark.parametrize("ref", [{"name": "ens1f0"}, {"mac": "52:54:00:00:00:01"}, {"pci": PF}])
def test_pf_matched_by_name_mac_or_pci(ref: dict[str, str]) -> None:
    [a] = plan(desired(sriov=[sriov(2, ref=ref)]), node(pf()), PlanState())
    assert isinstance(a, SetNumVfs) and a.pci == PF


def test_two_declarations_of_one_pf_block_the_second() -> None:
    d = desired(sriov=[sriov(2), sriov(2, ref={"name": "ens1f0"})])
    actions = plan(d, node(pf()), PlanState())
    assert isinstance(actions[0], SetNumVfs)
    assert isinstance(actions[1], Blocked) and "already declared" in actions[1].reason


def test_new_vfs_get_their_settings_in_the_same_plan_as_the_count() -> None:
    """VFs a numvfs write creates are new: their declared rtnetlink settings follow the
    write at once, every one of them (nothing to compare against yet), and nothing that
    was not declared: a VLAN's protocol is sent with it as 802.1Q, not planned as a
    change of its own ("vf 0 vlan_proto unset -> 802.1Q" with no vlan_proto declared)."""
    d = desired(
        sriov=[
            sriov(
                4,
                {"index": 0, "mac": "02:00:00:00:00:01", "vlan": 100},
                {"index": 3, "trust": True, "driver": "vfio-pci"},
            )
        ]
    )
    count, settings = plan(d, node(pf(numvfs=0)), PlanState())
    assert isinstance(count, SetNumVfs) and (count.old, count.new) == (0, 4)
    assert isinstance(settings, SetVfSettings) and settings.pf_ifindex == 5
    assert {(c.vf, c.attr, c.old, c.new) for c in settings.changes} == {
        (0, "mac", None, "02:00:00:00:00:01"),
        (0, "vlan", None, 100),
        (3, "trust", None, True),
    }
    assert settings.reason == "set declared settings of new VF 0, VF 3"


def test_new_vfs_settings_follow_a_count_change_through_zero() -> None:
    d = desired(sriov=[sriov(4, {"index": 1, "spoofchk": False})])
    actions = plan(d, node(pf(numvfs=2)), PlanState())
    assert [type(a) for a in actions] == [SetNumVfs, SetNumVfs, SetVfSettings]
    assert [c.vf for c in actions[2].changes] == [1]  # type: ignore[attr-defined]


def test_new_vfs_settings_skip_what_the_driver_refused_and_need_a_pf_netdev() -> None:
    d = desired(sriov=[sriov(4, {"index": 0, "mac": "02:00:00:00:00:01", "link_state": "enable"})])
    refused = UnsupportedKey(PF, "mlx5_core", 0, "link_state", "enable", "EOPNOTSUPP")
    _, settings = plan(d, node(pf(numvfs=0)), PlanState(unsupported=frozenset({refused})))
    assert isinstance(settings, SetVfSettings)
    assert [c.attr for c in settings.changes] == ["mac"]
    # Only the refused one declared: nothing to send with the count.
    d = desired(sriov=[sriov(4, {"index": 0, "link_state": "enable"})])
    assert [
        type(a) for a in plan(d, node(pf(numvfs=0)), PlanState(unsupported=frozenset({refused})))
    ] == [SetNumVfs]
    # No PF netdev: settings cannot be sent; the pass after the count says why.
    d = desired(sriov=[sriov(4, {"index": 0, "mac": "02:00:00:00:00:01"})])
    assert [type(a) for a in plan(d, node(pf(numvfs=0, netdev=None)), PlanState())] == [SetNumVfs]


def test_no_settings_planned_when_the_count_is_blocked() -> None:
    d = desired(sriov=[sriov(4, {"index": 0, "mac": "02:00:00:00:00:01"})])
    actions = plan(d, node(pf(numvfs=2, usage={0: HELD})), PlanState())
    assert [type(a) for a in actions] == [Blocked]


def test_vf_settings_batched_per_pf() -> None:
    d = desired(
        sriov=[
            sriov(
                4,
                {"index": 0, "mac": "02:00:00:00:00:01", "vlan": 100, "qos": 3},
                {"index": 2, "trust": True, "link_state": "disable"},
            )
        ]
    )
    [a] = plan(d, node(pf(numvfs=4)), PlanState())
    assert isinstance(a, SetVfSettings) and a.pf_netdev == "ens1f0"
    assert {(c.vf, c.attr, c.new) for c in a.changes} == {
        (0, "mac", "02:00:00:00:00:01"),
        (0, "vlan", 100),
        (0, "qos", 3),
        (2, "trust", True),
        (2, "link_state", "disable"),
    }


def test_vf_not_appeared_yet_waits() -> None:
    p = pf(numvfs=4)
    p = replace(p, vfs=p.vfs[:1])
    [a] = plan(desired(sriov=[sriov(4, {"index": 3, "trust": True})]), node(p), PlanState())
    assert isinstance(a, Waiting) and "VF 3" in a.reason


def test_unreadable_settings_wait_not_guess() -> None:
    p = pf(numvfs=2)
    p = replace(
        p,
        vfs=tuple(replace(v, settings=None) for v in p.vfs),
        settings_note="the kernel's VF list is truncated",
    )
    [a] = plan(desired(sriov=[sriov(2, {"index": 1, "trust": True})]), node(p), PlanState())
    assert isinstance(a, Waiting) and "truncated" in a.reason


def test_settings_without_pf_netdev_are_blocked() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "trust": True})])
    actions = plan(d, node(pf(numvfs=2, netdev=None)), PlanState())
    assert isinstance(actions[-1], Blocked) and "no netdev" in actions[-1].reason


def test_driver_binding_only_when_free() -> None:
    d = desired(
        sriov=[sriov(2, {"index": 0, "driver": "vfio-pci"}, {"index": 1, "driver": "vfio-pci"})]
    )
    actions = plan(d, node(pf(numvfs=2, usage={1: HELD})), PlanState())
    binds = [a for a in actions if isinstance(a, BindVfDriver)]
    assert [b.vf_pci for b in binds] == [pf(numvfs=2).vfs[0].pci]
    [blocked] = [a for a in actions if isinstance(a, Blocked)]
    assert "VF 1" in blocked.reason and "pid 4242" in blocked.reason


def test_ib_guids_rebind_free_vf() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "node_guid": "00:11:22:33:44:55:66:77"})])
    [a] = plan(d, node(pf(numvfs=2, ib=True)), PlanState())
    assert isinstance(a, SetIbVf) and a.rebind and a.ib_device == "mlx5_0"


def test_ib_guid_on_used_vf_blocked_and_policy_reported() -> None:
    d = desired(
        sriov=[sriov(2, {"index": 1, "node_guid": "00:11:22:33:44:55:66:77", "policy": "Up"})]
    )
    actions = plan(d, node(pf(numvfs=2, ib=True, usage={1: HELD})), PlanState())
    assert any(isinstance(a, Blocked) and "pid 4242" in a.reason for a in actions)
    assert not any(isinstance(a, SetIbVf) for a in actions)
    [note] = [a for a in actions if isinstance(a, InUseDrift)]
    assert (note.vf, note.attr) == (1, "policy") and "pid 4242" in note.reason


def test_ib_guid_on_used_vf_blocked_and_policy_applied_when_declared() -> None:
    vf = {"index": 1, "node_guid": "00:11:22:33:44:55:66:77", "policy": "Up"}
    d = desired(sriov=[{**sriov(2, vf), "in_use_drift": "apply"}])
    actions = plan(d, node(pf(numvfs=2, ib=True, usage={1: HELD})), PlanState())
    assert any(isinstance(a, Blocked) and "pid 4242" in a.reason for a in actions)
    [ib] = [a for a in actions if isinstance(a, SetIbVf)]
    assert [c.attr for c in ib.changes] == ["policy"] and not ib.rebind


@pytest.mark.parametrize("usage", [HELD, UNKNOWN])
def test_ib_policy_on_in_use_vf_is_reported_not_rewritten(usage: Usage) -> None:
    # policy Follow -> Down would take the VM's IB port down under it.
    d = desired(sriov=[sriov(2, {"index": 1, "policy": "Down"})])
    actions = plan(d, node(pf(numvfs=2, ib=True, usage={1: usage})), PlanState())
    [note] = actions
    assert isinstance(note, InUseDrift) and (note.vf, note.attr) == (1, "policy")
    assert "Follow (declared Down)" in note.reason and usage.holders[0] in note.reason
    [status] = summarize(declared_objects(d), actions)
    assert status.state.value == "drift-on-in-use-vf"


@pytest.mark.parametrize("where", ["pf", "vf"])
def test_ib_policy_on_in_use_vf_applied_when_declared(where: str) -> None:
    vf: dict[str, object] = {"index": 1, "policy": "Down"}
    doc = sriov(2, vf)
    if where == "pf":
        doc["in_use_drift"] = "apply"
    else:
        vf["in_use_drift"] = "apply"
    [a] = plan(desired(sriov=[doc]), node(pf(numvfs=2, ib=True, usage={1: HELD})), PlanState())
    assert isinstance(a, SetIbVf) and not a.rebind
    assert [(c.vf, c.attr, c.old, c.new) for c in a.changes] == [(1, "policy", "Follow", "Down")]


def test_ib_guid_with_driver_change_rebinds_once() -> None:
    d = desired(
        sriov=[sriov(2, {"index": 0, "node_guid": "00:11:22:33:44:55:66:77", "driver": "vfio-pci"})]
    )
    actions = plan(d, node(pf(numvfs=2, ib=True)), PlanState())
    assert [type(a) for a in actions] == [SetIbVf, BindVfDriver]
    assert not actions[0].rebind  # type: ignore[attr-defined]


def test_ib_settings_on_ethernet_pf_blocked() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "policy": "Up"})])
    [a] = plan(d, node(pf(numvfs=2, ib=False)), PlanState())
    assert isinstance(a, Blocked) and "InfiniBand" in a.reason


def test_undeclared_pf_untouched() -> None:
    assert plan(desired(), node(pf(numvfs=4, usage={0: HELD})), PlanState()) == []


# --- rxe rules ---------------------------------------------------------------------------

RXE = {"name": "rxe0", "netdev": {"name": "eth0"}}


def test_rxe_created_on_existing_netdev() -> None:
    [a] = plan(desired(rxe=[RXE]), node(), PlanState())
    assert isinstance(a, AddRxe) and (a.name, a.netdev) == ("rxe0", "eth0")


def test_rxe_created_on_down_netdev() -> None:
    # The kernel accepts it; the port becomes ACTIVE when the netdev comes up (LAB.md).
    [a] = plan(desired(rxe=[{"name": "rxe1", "netdev": {"name": "veth1"}}]), node(), PlanState())
    assert isinstance(a, AddRxe)


def test_rxe_loads_module_first() -> None:
    actions = plan(desired(rxe=[RXE]), node(modules=frozenset()), PlanState())
    assert [type(a) for a in actions] == [LoadModule, AddRxe]


def test_rxe_module_loading_disabled() -> None:
    [a] = plan(desired(rxe=[RXE]), node(modules=frozenset(), disabled=True), PlanState())
    assert isinstance(a, Blocked) and "modules_disabled" in a.reason


def test_rxe_present_is_converged() -> None:
    link = RdmaLinkObserved("rxe0", "rxe", "eth0")
    assert plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState()) == []


def test_rxe_waits_for_netdev() -> None:
    [a] = plan(
        desired(rxe=[{"name": "rxe0", "netdev": {"mac": "02:aa:00:00:00:01"}}]), node(), PlanState()
    )
    assert isinstance(a, Waiting)


def test_rxe_name_taken_by_non_rxe_device() -> None:
    link = RdmaLinkObserved("rxe0", "mlx5_core", "ens1f0")
    [a] = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState())
    assert isinstance(a, Blocked) and "not an rxe link" in a.reason


def test_rxe_name_of_a_device_whose_driver_cannot_be_read_waits() -> None:
    # Seen mid-teardown: listed, but driver and netdev already gone. Neither "not an rxe
    # link" (blocked, a warning) nor ours to delete or re-create yet.
    for netdev in (None, "eth0", "veth1"):
        link = RdmaLinkObserved("rxe0", None, netdev)
        state = PlanState(managed_rxe=frozenset({"rxe0"}))
        [a] = plan(desired(rxe=[RXE]), node(rdma=(link,)), state)
        assert isinstance(a, Waiting) and "driver cannot be read" in a.reason


def test_foreign_rxe_on_other_netdev_not_deleted() -> None:
    link = RdmaLinkObserved("rxe0", "rxe", "veth1")
    [a] = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState())
    assert isinstance(a, Blocked) and "not created by rdmad" in a.reason


def test_managed_rxe_on_wrong_netdev_recreated() -> None:
    link = RdmaLinkObserved("rxe0", "rxe", "veth1")
    actions = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState(frozenset({"rxe0"})))
    assert [type(a) for a in actions] == [DeleteRxe, AddRxe]


def test_managed_rxe_in_use_on_the_old_netdev_is_not_moved() -> None:
    # Declared on another netdev now, but a verbs job holds it where it is: moving it
    # would delete it under the job.
    link = RdmaLinkObserved("rxe0", "rxe", "veth1", usage=HELD)
    actions = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState(frozenset({"rxe0"})))
    assert not any(isinstance(a, DeleteRxe | AddRxe) for a in actions)
    [a] = actions
    assert isinstance(a, Blocked) and f"in use: {HELD.holders[0]}" in a.reason


def test_netdev_already_carries_other_rxe() -> None:
    link = RdmaLinkObserved("other", "rxe", "eth0")
    [a] = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState())
    assert isinstance(a, Blocked) and "'other'" in a.reason


def test_stale_managed_rxe_removed_when_free() -> None:
    link = RdmaLinkObserved("old", "rxe", "veth1")
    [a] = plan(desired(), node(rdma=(link,)), PlanState(frozenset({"old"})))
    assert isinstance(a, DeleteRxe) and a.name == "old"


def test_stale_managed_rxe_in_use_kept() -> None:
    link = RdmaLinkObserved("old", "rxe", "veth1", usage=HELD)
    [a] = plan(desired(), node(rdma=(link,)), PlanState(frozenset({"old"})))
    assert isinstance(a, Blocked) and "in use" in a.reason


def test_unmanaged_rxe_never_removed() -> None:
    link = RdmaLinkObserved("theirs", "rxe", "veth1")
    assert plan(desired(), node(rdma=(link,)), PlanState()) == []


def test_stale_rxe_freeing_the_netdev_allows_declared_one() -> None:
    link = RdmaLinkObserved("old", "rxe", "eth0")
    actions = plan(desired(rxe=[RXE]), node(rdma=(link,)), PlanState(frozenset({"old"})))
    assert [type(a) for a in actions] == [DeleteRxe, AddRxe]


def test_no_rdma_netlink_blocks_rxe() -> None:
    o = replace(node(), rdma_netlink=False)
    [a] = plan(desired(rxe=[RXE]), o, PlanState())
    assert isinstance(a, Blocked) and "NETLINK_RDMA" in a.reason


# --- safety rules: drift on in-use VFs, refused attributes, unbound VFs, ambiguity -------


@pytest.mark.parametrize(
    ("current", "planned"), [("802.1ad", True), ("0x0000", True), (None, False)]
)
def test_vlan_without_protocol_means_802_1q(current: str | None, planned: bool) -> None:
    p = pf(numvfs=1)
    vf0 = p.vfs[0]
    assert vf0.settings is not None
    vf0 = replace(vf0, settings=replace(vf0.settings, vlan=100, vlan_proto=current))
    d = desired(sriov=[sriov(1, {"index": 0, "vlan": 100})])
    actions = plan(d, node(replace(p, vfs=(vf0,))), PlanState())
    changes = [c for a in actions if isinstance(a, SetVfSettings) for c in a.changes]
    if planned:
        assert [(c.attr, c.old, c.new) for c in changes] == [("vlan_proto", current, "802.1Q")]
    else:
        assert changes == []  # not reported by the kernel: nothing to compare


def test_no_vlan_leaves_an_unknown_protocol_alone() -> None:
    p = pf(numvfs=1)
    vf0 = p.vfs[0]
    assert vf0.settings is not None
    fresh = replace(vf0.settings, vlan=0, vlan_proto="0x0000")  # netdevsim
    o = node(replace(p, vfs=(replace(vf0, settings=fresh),)))
    assert plan(desired(sriov=[sriov(1, {"index": 0, "vlan": 0})]), o, PlanState()) == []


def test_pf_matched_by_mac_of_two_pfs_is_blocked() -> None:
    other = replace(pf(), pci="0000:3b:00.1", netdev="ens1f1")
    d = desired(sriov=[sriov(2, ref={"mac": "52:54:00:00:00:01"})])
    [a] = plan(d, node(pf(), other), PlanState())
    assert isinstance(a, Blocked) and "matches several PFs" in a.reason
    assert PF in a.reason and "0000:3b:00.1" in a.reason


def test_drift_on_in_use_vf_is_reported_not_rewritten() -> None:
    d = desired(sriov=[sriov(2, {"index": 1, "mac": "02:00:00:00:00:01", "trust": True})])
    actions = plan(d, node(pf(numvfs=2, usage={1: HELD})), PlanState())
    assert not any(isinstance(a, SetVfSettings) for a in actions)
    [note] = actions
    assert isinstance(note, InUseDrift) and note.vf == 1
    assert "pid 4242" in note.reason and "mac" in note.reason and "trust" in note.reason
    [status] = summarize(declared_objects(d), actions)
    assert status.state.value == "drift-on-in-use-vf"


@pytest.mark.parametrize("where", ["pf", "vf"])
def test_drift_on_in_use_vf_applied_when_declared(where: str) -> None:
    vf: dict[str, object] = {"index": 1, "mac": "02:00:00:00:00:01"}
    doc = sriov(2, vf)
    if where == "pf":
        doc["in_use_drift"] = "apply"
    else:
        vf["in_use_drift"] = "apply"
    [a] = plan(desired(sriov=[doc]), node(pf(numvfs=2, usage={1: HELD})), PlanState())
    assert isinstance(a, SetVfSettings) and a.pf_ifindex == 5
    assert [(c.vf, c.attr) for c in a.changes] == [(1, "mac")]


def test_free_vfs_still_restored_beside_an_in_use_one() -> None:
    mac = {"mac": "02:00:00:00:00:01"}
    d = desired(sriov=[sriov(2, {"index": 0, **mac}, {"index": 1, **mac})])
    actions = plan(d, node(pf(numvfs=2, usage={1: UNKNOWN})), PlanState())
    [change] = [a for a in actions if isinstance(a, SetVfSettings)]
    assert [c.vf for c in change.changes] == [0]
    assert any(isinstance(a, InUseDrift) and a.vf == 1 for a in actions)


def test_refused_attribute_is_not_planned_again() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "link_state": "enable", "trust": True})])
    refused = UnsupportedKey(PF, "mlx5_core", 0, "link_state", "enable", "EOPNOTSUPP")
    actions = plan(d, node(pf(numvfs=2)), PlanState(unsupported=frozenset({refused})))
    [change] = [a for a in actions if isinstance(a, SetVfSettings)]
    assert [c.attr for c in change.changes] == ["trust"]
    [note] = [a for a in actions if isinstance(a, Unsupported)]
    assert "link_state" in note.reason and "mlx5_core" in note.reason
    assert "EOPNOTSUPP" in note.reason


def test_refusal_by_another_driver_or_of_another_value_is_retried() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "link_state": "enable"})])
    for key in (
        UnsupportedKey(PF, "igb", 0, "link_state", "enable"),  # the driver changed
        UnsupportedKey(PF, "mlx5_core", 0, "link_state", "disable"),  # the config changed
    ):
        [a] = plan(d, node(pf(numvfs=2)), PlanState(unsupported=frozenset({key})))
        assert isinstance(a, SetVfSettings)


def test_only_refusals_left_is_unsupported_state() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "link_state": "enable"})])
    key = UnsupportedKey(PF, "mlx5_core", 0, "link_state", "enable", "EOPNOTSUPP")
    actions = plan(d, node(pf(numvfs=2)), PlanState(unsupported=frozenset({key})))
    [status] = summarize(declared_objects(d), actions)
    assert status.state.value == "unsupported-by-driver"
    assert not any(a.changes_kernel for a in actions)


def test_vf_declared_unbound_is_unbound_and_kept_so() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "driver": "none"})])
    [a] = plan(d, node(pf(numvfs=2)), PlanState())
    assert isinstance(a, BindVfDriver) and a.new == "none" and a.old == "vfdrv"
    assert a.load_module is False and "unbound" in a.reason
    kept = pf(numvfs=2)
    vf0 = replace(kept.vfs[0], driver=None, driver_override="none")
    kept = replace(kept, vfs=(vf0, kept.vfs[1]))
    assert plan(d, node(kept), PlanState()) == []


def test_unbound_vf_without_override_gets_one() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "driver": "none"})])
    p = pf(numvfs=2)
    p = replace(p, vfs=(replace(p.vfs[0], driver=None), p.vfs[1]))
    [a] = plan(d, node(p), PlanState())
    assert isinstance(a, BindVfDriver) and a.old is None and a.override_old is None


def test_vf_driver_module_loaded_only_when_missing() -> None:
    d = desired(sriov=[sriov(2, {"index": 0, "driver": "vfio-pci"})])
    [a] = plan(d, node(pf(numvfs=2)), PlanState())
    assert isinstance(a, BindVfDriver) and a.load_module is True
    loaded = frozenset({"rdma_rxe", "vfio_pci"})
    [b] = plan(d, node(pf(numvfs=2), modules=loaded), PlanState())
    assert isinstance(b, BindVfDriver) and b.load_module is False


def test_unbinding_an_in_use_vf_is_blocked() -> None:
    d = desired(sriov=[sriov(2, {"index": 1, "driver": "none"})])
    [a] = plan(d, node(pf(numvfs=2, usage={1: HELD})), PlanState())
    assert isinstance(a, Blocked) and "pid 4242" in a.reason


def test_managed_rxe_kept_when_declared_netdev_is_absent() -> None:
    link = RdmaLinkObserved("rxe0", "rxe", "veth1")
    typo = {"name": "rxe0", "netdev": {"name": "eht0"}}
    [a] = plan(desired(rxe=[typo]), node(rdma=(link,)), PlanState(frozenset({"rxe0"})))
    assert isinstance(a, Blocked) and "kept" in a.reason and "eht0" in a.reason


def test_managed_rxe_kept_when_replacement_netdev_is_taken() -> None:
    ours = RdmaLinkObserved("rxe0", "rxe", "veth1")
    theirs = RdmaLinkObserved("rxe9", "rxe", "eth0")
    actions = plan(desired(rxe=[RXE]), node(rdma=(ours, theirs)), PlanState(frozenset({"rxe0"})))
    assert not any(isinstance(a, DeleteRxe) for a in actions)
    [a] = actions
    assert isinstance(a, Blocked) and "rxe9" in a.reason


def test_delete_records_where_the_link_was() -> None:
    link = RdmaLinkObserved("old", "rxe", "veth1")
    [a] = plan(desired(), node(rdma=(link,)), PlanState(frozenset({"old"})))
    assert isinstance(a, DeleteRxe) and a.netdev == "veth1"


# --- properties ----------------------------------------------------------------------------

MACS = st.sampled_from(["02:00:00:00:00:01", "02:00:00:00:00:02", "0a:bc:de:f0:00:01"])
GUIDS = st.sampled_from(["00:11:22:33:44:55:66:77", "00:00:00:00:00:00:00:01"])
USAGE = st.sampled_from([Usage(Use.FREE), HELD, UNKNOWN])


@st.composite
def vf_specs(draw: st.DrawFn, index: int, ib: bool) -> dict[str, object]:
    spec: dict[str, object] = {"index": index}
    for key, strat in (
        ("mac", MACS),
        ("spoofchk", st.booleans()),
        ("trust", st.booleans()),
        ("link_state", st.sampled_from(["auto", "enable", "disable"])),
        ("max_tx_rate", st.integers(0, 10000)),
        ("query_rss", st.booleans()),
        ("driver", st.sampled_from(["vfio-pci", "vfdrv", "none"])),
    ):
        if draw(st.booleans()):
            spec[key] = draw(strat)
    if draw(st.booleans()):
        spec["vlan"] = draw(st.integers(0, 4094))
        spec["qos"] = draw(st.integers(0, 7))
    if ib and draw(st.booleans()):
        spec["node_guid"] = draw(GUIDS)
        spec["policy"] = draw(st.sampled_from(["Follow", "Up", "Down"]))
    return spec


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Desired, Observed, PlanState]:
    total = draw(st.integers(1, 8))
    ib = draw(st.booleans())
    current = draw(st.integers(0, total))
    p = pf(numvfs=current, totalvfs=total, ib=ib)
    p = replace(
        p,
        vfs=tuple(replace(v, usage=draw(USAGE)) for v in p.vfs),
        driver=draw(st.sampled_from(["mlx5_core", "bnxt_en"])),
        operstate_up=draw(st.sampled_from([True, False, None])),
    )
    want = draw(st.integers(0, total))
    indexes = draw(st.sets(st.integers(0, max(want - 1, 0)), max_size=want))
    vfs = [draw(vf_specs(i, ib)) for i in sorted(indexes)] if want else []
    rxe = [RXE] if draw(st.booleans()) else []
    links: tuple[RdmaLinkObserved, ...] = ()
    if draw(st.booleans()):
        links = (RdmaLinkObserved("old", "rxe", "veth1", usage=draw(USAGE)),)
    managed = frozenset({"old"}) if draw(st.booleans()) else frozenset()
    d = desired(sriov=[sriov(want, *vfs)], rxe=rxe)
    loaded = frozenset({"rdma_rxe"}) if draw(st.booleans()) else frozenset()
    return d, node(p, rdma=links, modules=loaded), PlanState(managed)


def converge(d: Desired, o: Observed, s: PlanState, passes: int = 6) -> tuple[SimKernel, list]:
    kernel = SimKernel(o)
    actions = plan(d, kernel.observed, s)
    for _ in range(passes):
        if not any(a.changes_kernel for a in actions):
            break
        kernel.apply_all(actions)
        actions = plan(d, kernel.observed, s)
    return kernel, actions


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_applying_plans_converges_and_hurts_nothing(
    case: tuple[Desired, Observed, PlanState],
) -> None:
    d, o, s = case
    kernel, final = converge(d, o, s)
    assert kernel.hurt == [], f"an in-use object was destroyed, rebound or rewritten: {kernel.hurt}"
    assert not any(a.changes_kernel for a in final), f"no fixed point: {final}"
    busy = any(v.usage.busy for p in o.pfs for v in p.vfs) or any(
        r.usage.busy for r in o.rdma_links
    )
    if not busy:
        assert all(isinstance(a, Waiting) for a in final) or final == []
        assert not any(isinstance(a, Blocked) for a in final), final


@settings(max_examples=300)
@given(scenarios())
def test_an_applied_write_is_not_planned_again(case: tuple[Desired, Observed, PlanState]) -> None:
    """Idempotence step by step: a write, once applied, leaves nothing for the next pass to
    write again (a planner that compared with the wrong value would write it every pass)."""
    d, o, s = case
    kernel = SimKernel(o)
    for _ in range(6):
        writes = [a for a in plan(d, kernel.observed, s) if a.changes_kernel]
        if not writes:
            break
        kernel.apply_all(writes)
        again = [a for a in plan(d, kernel.observed, s) if a.changes_kernel]
        assert not [a for a in again if a in writes], f"planned again after applying: {again}"


@settings(max_examples=300)
@given(scenarios())
def test_plan_never_changes_count_of_pf_with_vfs_in_use(
    case: tuple[Desired, Observed, PlanState],
) -> None:
    d, o, s = case
    used = {p.pci for p in o.pfs if any(v.usage.busy for v in p.vfs)}
    for a in plan(d, o, s):
        if isinstance(a, SetNumVfs):
            assert a.pci not in used


@settings(max_examples=100)
@given(scenarios(), scenarios())
def test_plan_is_pure(
    case: tuple[Desired, Observed, PlanState], other: tuple[Desired, Observed, PlanState]
) -> None:
    """No state carried between calls (a cache keyed on the config, say) and no input
    changed: planning another node in between leaves a plan as it was, and every input
    is deep-equal to a copy taken before."""
    before = copy.deepcopy(case)
    first = plan(*case)
    plan(*other)
    assert plan(*case) == first
    assert case == before


def test_ib_defaults_are_what_vfs_start_with() -> None:
    # A sanity check on the simulated kernel the properties rely on.
    assert make_vfs(pf(ib=True), 1)[0].ib == IbVfSettings(
        "00:00:00:00:00:00:00:00", "00:00:00:00:00:00:00:00", "Follow"
    )


def test_a_vf_settings_reason_names_many_vfs_in_spans() -> None:
    from rdmad.reconcile.sriov import _vf_list

    assert _vf_list({3, 0}) == "VF 0, VF 3"
    assert _vf_list(set(range(64))) == "64 VFs (0-63)"
    assert _vf_list({0, 1, 2, 5, 7, 8, 10}) == "7 VFs (0-2, 5, 7-8, 10)"
