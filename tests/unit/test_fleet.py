"""One config for a fleet: PF selectors, VF ranges, derived MACs, and the rule that keeps
two declarations of one PF apart (rdmad.reconcile.resolve, rdmad.reconcile.macs)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from rdmad import cli
from rdmad.config.validation import parse
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import (
    Blocked,
    Desired,
    Note,
    ObjectState,
    Observed,
    PfObserved,
    PlanState,
    SetNumVfs,
    SetVfSettings,
    VfSettings,
    Waiting,
    summarize,
)
from rdmad.model.validation import SpecError, validate
from rdmad.reconcile import declared_objects, plan
from rdmad.reconcile.detail import describe
from rdmad.reconcile.guard import guarded_modules
from rdmad.reconcile.macs import derive_mac
from rdmad.reconcile.resolve import resolve
from rdmad.tomlcompat import tomllib
from tests.support.fakesysfs import FakeSysfs
from tests.support.records import replace
from tests.support.simkernel import make_vfs

ROOT = Path(__file__).resolve().parents[2]
MACHINE_ID = "4c2a7d0e5b1f4a3c9d8e7f6a5b4c3d2e"
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def desired(*sriov: dict[str, object]) -> Desired:
    return validate(Desired, {"sriov": list(sriov)})


def pf(
    pci: str,
    vendor: str | None,
    device: str | None,
    driver: str | None,
    netdev: str | None,
    perm_mac: str | None,
    numvfs: int = 0,
    totalvfs: int = 16,
) -> PfObserved:
    base = PfObserved(
        pci=pci,
        driver=driver,
        netdev=netdev,
        ifindex=10,
        mac=perm_mac,
        perm_mac=perm_mac,
        numvfs=numvfs,
        totalvfs=totalvfs,
        vendor=vendor,
        device=device,
        driver_module=driver,
    )
    return replace(base, vfs=make_vfs(base, numvfs))


# A node with mixed vendors: two ConnectX-5 ports, an E810, an igb, a netdevsim device.
CX5_0 = pf("0000:3b:00.0", "15b3", "1017", "mlx5_core", "ens1f0np0", "b8:ce:f6:00:00:10", 16)
CX5_1 = pf("0000:3b:00.1", "15b3", "1017", "mlx5_core", "ens1f1np1", "b8:ce:f6:00:00:11", 16)
E810 = pf("0000:5e:00.0", "8086", "1593", "ice", "ens2f0", "40:a6:b7:00:00:01", 8)
IGB = pf("0000:01:00.0", "8086", "10c9", "igb", "enp1s0", "52:54:00:12:34:56", 0, 7)
NSIM = pf("netdevsim0", None, None, "netdevsim", "eni0np1", None, 0, 4)


def node(*pfs: PfObserved, machine_id: str | None = MACHINE_ID) -> Observed:
    return Observed(pfs=pfs, machine_id=machine_id)


MIXED = node(CX5_0, CX5_1, E810, IGB, NSIM)


# --- selectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("select", "matched"),
    [
        ({"vendor": "15b3"}, ["0000:3b:00.0", "0000:3b:00.1"]),
        ({"vendor": "8086"}, ["0000:5e:00.0", "0000:01:00.0"]),
        ({"vendor": "8086", "device": "10C9"}, ["0000:01:00.0"]),
        ({"vendor": ["15b3", "8086"], "device": ["1017", "1593"]}, [
            "0000:3b:00.0", "0000:3b:00.1", "0000:5e:00.0",
        ]),
        ({"driver": "mlx5_*"}, ["0000:3b:00.0", "0000:3b:00.1"]),
        ({"driver": "netdevsim"}, ["netdevsim0"]),
        ({"pci_path": "0000:3b:*"}, ["0000:3b:00.0", "0000:3b:00.1"]),
        ({"pci_path": "*.1"}, ["0000:3b:00.1"]),
        ({"name": "ens*f0*"}, ["0000:3b:00.0", "0000:5e:00.0"]),
        ({"vendor": "15b3", "name": "ens2*"}, []),
        ({"vendor": "14e4"}, []),
    ],
)  # fmt: skip
def test_a_selector_matches_every_pf_that_fits_each_key(
    select: dict[str, object], matched: list[str]
) -> None:
    res = resolve(desired({"select": select, "numvfs": 2}), MIXED)
    assert [t.ref.pci for t in res.targets] == matched
    assert [t.obj for t in res.targets] == [f"sriov pci={p}" for p in matched]


def test_a_netdevsim_device_has_no_pci_ids_so_vendor_never_matches_it() -> None:
    res = resolve(desired({"select": {"vendor": ["15b3", "8086"]}, "numvfs": 1}), node(NSIM))
    assert res.targets == ()


def test_a_selector_that_matches_nothing_is_converged_with_a_note() -> None:
    d = desired({"select": {"vendor": "8086", "device": "10c9"}, "numvfs": 4})
    obs = node(CX5_0)
    actions = plan(d, obs, PlanState())
    [status] = summarize(declared_objects(d, obs), actions)
    assert status.obj == "sriov select:vendor=8086,device=10c9"
    assert status.state is ObjectState.CONVERGED
    assert status.message == "no PF matches vendor 8086, device 10c9 on this node: nothing to do"
    assert not any(a.changes_kernel for a in actions)
    detail = describe(d, obs, actions)[status.obj]
    assert detail.desired["select"] == "select:vendor=8086,device=10c9"


# At boot, before coldplug reached it: no driver bound, so no netdev either.
UNPROBED = replace(
    IGB, driver=None, netdev=None, ifindex=None, mac=None, perm_mac=None, driver_module=None
)


def statuses(d: Desired, obs: Observed) -> dict[str, tuple[ObjectState, str]]:
    return {
        s.obj: (s.state, s.message)
        for s in summarize(declared_objects(d, obs), plan(d, obs, PlanState()))
    }


@pytest.mark.parametrize(
    "select", [{"driver": "igb"}, {"name": "enp*"}, {"driver": "igb", "vendor": "8086"}]
)
def test_a_pf_udev_has_not_processed_waits_for_a_selector_it_could_match(
    select: dict[str, object],
) -> None:
    """Issue 61 (a unit consumers wait on): with a driver or name selector, a PF whose
    driver udev has not loaded yet matched nothing, so the node read converged at boot
    before coldplug reached it, and a consumer ordered after rdmad-wait-converged
    started before its VFs. It waits now, under the name it gets when it matches."""
    d = desired({"select": select, "numvfs": 4})
    pending = replace(UNPROBED, udev_pending=True)
    got = statuses(d, node(CX5_0, pending))
    state, why = got["sriov pci=0000:01:00.0"]
    assert state is ObjectState.PENDING, got
    assert why.startswith("0000:01:00.0 has no driver bound yet and udev has not processed it")
    [selector] = [o for o in got if o.startswith("sriov select:")]
    assert got[selector][0] is ObjectState.CONVERGED
    assert "yet; 0000:01:00.0 may once its driver is bound" in got[selector][1]
    assert not node_converged(d, node(CX5_0, pending))
    # Once udev has processed it, a PF with no driver matches nothing, as documented;
    # the selector's note names it (a driver unloaded, or none loaded for it).
    processed = statuses(d, node(CX5_0, UNPROBED))
    assert set(processed) == {selector}
    assert processed[selector][0] is ObjectState.CONVERGED
    assert processed[selector][1].endswith(
        "0000:01:00.0 has no driver bound and may match once one is: nothing to do until then"
    )
    assert node_converged(d, node(CX5_0, UNPROBED))
    # Its driver bound: the selector's own PF, planned.
    actions = plan(d, node(CX5_0, IGB), PlanState())
    assert any(isinstance(a, SetNumVfs) and a.obj == "sriov pci=0000:01:00.0" for a in actions)


def test_a_pf_udev_has_not_processed_is_not_waited_for_by_a_selector_it_cannot_match() -> None:
    pending = replace(UNPROBED, udev_pending=True)
    for select in (
        {"vendor": "15b3"},
        {"driver": "igb", "device": "1593"},
        {"pci_path": "0000:3b:*"},
    ):
        d = desired({"select": select, "numvfs": 2})
        assert "sriov pci=0000:01:00.0" not in statuses(d, node(CX5_0, pending)), select
    # A selector that matches it already (vendor and device are read without a driver)
    # has it as a target, which waits for the driver as a literal pf does.
    d = desired({"select": {"vendor": "8086", "device": "10c9"}, "numvfs": 2})
    state, why = statuses(d, node(pending))["sriov pci=0000:01:00.0"]
    assert state is ObjectState.PENDING
    assert why == "0000:01:00.0 has no driver bound yet: udev has not processed it (at boot)"
    # Unknown (a lookup under /run/udev failed): waited for alike, in its own words.
    unknown = replace(pending, udev_unread="/run/udev/control")
    d = desired({"select": {"driver": "mlx5_core"}, "numvfs": 2})
    state, why = statuses(d, node(CX5_0, unknown))["sriov pci=0000:01:00.0"]
    assert state is ObjectState.PENDING
    assert why.startswith(
        "0000:01:00.0 has no driver bound, and whether udev has processed it is unknown "
        "(/run/udev/control could not be read): "
    )
    # A literal pf names it: its own declaration, no selector's.
    d = desired(
        {"pf": {"pci": "0000:01:00.0"}, "numvfs": 2}, {"select": {"driver": "igb"}, "numvfs": 2}
    )
    assert list(statuses(d, node(pending))) == ["sriov pci=0000:01:00.0", "sriov select:driver=igb"]


def node_converged(d: Desired, obs: Observed) -> bool:
    return all(state is ObjectState.CONVERGED for state, _ in statuses(d, obs).values())


def test_each_matched_pf_is_planned_as_its_own_object() -> None:
    d = desired({"select": {"vendor": "15b3"}, "numvfs": 4})
    obs = node(replace(CX5_0, numvfs=0, vfs=()), replace(CX5_1, numvfs=0, vfs=()))
    actions = plan(d, obs, PlanState())
    writes = [(a.obj, a.pci, a.new) for a in actions if isinstance(a, SetNumVfs)]
    assert writes == [
        ("sriov pci=0000:3b:00.0", "0000:3b:00.0", 4),
        ("sriov pci=0000:3b:00.1", "0000:3b:00.1", 4),
    ]
    details = describe(d, obs, actions)
    assert details["sriov pci=0000:3b:00.1"].desired["select"] == "select:vendor=15b3"
    assert details["sriov pci=0000:3b:00.1"].desired["pf"] == "pci=0000:3b:00.1"


def test_a_missing_literal_pf_still_waits() -> None:
    d = desired({"pf": {"pci": "0000:af:00.0"}, "numvfs": 4})
    [action] = plan(d, MIXED, PlanState())
    assert isinstance(action, Waiting) and action.obj == "sriov pci=0000:af:00.0"


def test_the_guard_follows_the_drivers_of_matched_pfs() -> None:
    d = desired({"select": {"vendor": "8086"}, "numvfs": 1})
    assert guarded_modules(d, MIXED) == (frozenset({"ice", "igb"}), False)


# --- two declarations of one PF ------------------------------------------------------------


def test_a_literal_pf_wins_over_a_selector_which_keeps_its_other_pfs() -> None:
    d = desired(
        {"select": {"vendor": "15b3"}, "numvfs": 8},
        {"pf": {"name": "ens1f1np1"}, "numvfs": 2},
    )
    res = resolve(d, MIXED)
    assert [(t.obj, t.spec.numvfs) for t in res.targets] == [
        ("sriov pci=0000:3b:00.0", 8),
        ("sriov name=ens1f1np1", 2),
    ]
    assert res.others == ()


def test_a_selector_whose_pfs_are_all_named_literally_says_so() -> None:
    d = desired(
        {"select": {"device": "10c9"}, "numvfs": 4},
        {"pf": {"pci": "0000:01:00.0"}, "numvfs": 2},
    )
    res = resolve(d, MIXED)
    [other] = res.others
    assert isinstance(other.action, Note)
    assert other.obj == "sriov select:device=10c9"
    assert "0000:01:00.0 (sriov pci=0000:01:00.0)" in other.action.reason
    assert "a literal pf, which wins over a selector" in other.action.reason


def test_two_selectors_on_one_pf_are_refused_there_naming_both() -> None:
    d = desired(
        {"select": {"vendor": "8086"}, "numvfs": 4},
        {"select": {"driver": "igb"}, "numvfs": 2},
    )
    obs = MIXED
    actions = plan(d, obs, PlanState())
    mine = [a for a in actions if a.obj == "sriov pci=0000:01:00.0"]
    assert len(mine) == 1 and isinstance(mine[0], Blocked)
    assert "select:vendor=8086 and select:driver=igb" in mine[0].reason
    assert "a literal pf wins over selectors" in mine[0].reason
    # The other PF of the first selector is planned as usual; nothing of either selector
    # is applied to the contested one.
    statuses = {s.obj: s for s in summarize(declared_objects(d, obs), actions)}
    assert statuses["sriov pci=0000:01:00.0"].state is ObjectState.BLOCKED
    assert "sriov pci=0000:5e:00.0" in statuses
    assert not any(isinstance(a, SetNumVfs) and a.pci == "0000:01:00.0" for a in actions)


def test_a_selector_and_a_literal_in_one_block_are_refused() -> None:
    with pytest.raises(SpecError, match="pf and select are two ways"):
        desired({"pf": {"pci": "0000:01:00.0"}, "select": {"vendor": "8086"}, "numvfs": 1})


@pytest.mark.parametrize(
    ("select", "error"),
    [
        ({}, "a selector needs at least one of vendor, device, driver, pci_path, name"),
        ({"vendor": "intel"}, "not a PCI ID (want 4 hex digits"),
        ({"device": []}, "an empty array matches nothing"),
        ({"model": "x"}, "unknown key"),
    ],
)
def test_a_bad_selector_is_refused(select: dict[str, object], error: str) -> None:
    with pytest.raises(SpecError, match=re.escape(error)):
        desired({"select": select, "numvfs": 1})


def test_drop_ins_merge_the_same_selector_key_for_key() -> None:
    first = {"sriov": [{"select": {"vendor": "15B3"}, "numvfs": 4, "vf": [{"index": "0-3"}]}]}
    later = {
        "sriov": [
            {"select": {"vendor": ["0x15b3"]}, "numvfs": 8, "vf": [{"index": "0-3", "trust": True}]}
        ]
    }
    d, errors = parse([("a.toml", first), ("b.toml", later)])
    assert errors == [] and d is not None
    [spec] = d.sriov
    assert spec.numvfs == 8 and [(v.index, v.trust) for v in spec.vf] == [("0-3", True)]


def test_one_file_declaring_one_selector_twice_is_an_error() -> None:
    doc = {"sriov": [{"select": {"driver": "ice"}, "numvfs": 1}] * 2}
    _, errors = parse([("a.toml", doc)])
    assert any("the selector driver=ice is already declared" in e.message for e in errors)


# --- VF ranges ------------------------------------------------------------------------------


def test_ranges_rest_and_a_vfs_own_block_layer_in_that_order() -> None:
    d = desired(
        {
            "pf": {"pci": "0000:3b:00.0"},
            "numvfs": 12,
            "vf": [
                {"index": "0-3", "vlan": 100, "trust": False},
                {"index": "rest", "vlan": 300, "spoofchk": True},
                {"index": "4-7", "vlan": 200},
                {"index": 1, "vlan": 101},
                {"index": 9, "trust": True},
            ],
        }
    )
    [target] = resolve(d, MIXED).targets
    got = {v.index: (v.vlan, v.trust, v.spoofchk) for v in target.vfs}
    assert got == {
        0: (100, False, None),
        1: (101, False, None),  # its own block overrides the range's VLAN only
        2: (100, False, None),
        3: (100, False, None),
        4: (200, None, None),
        5: (200, None, None),
        6: (200, None, None),
        7: (200, None, None),
        8: (300, None, True),
        9: (300, True, True),  # in "rest", with its own block on top
        10: (300, None, True),
        11: (300, None, True),
    }


def test_a_range_is_planned_like_the_vfs_it_covers() -> None:
    d = desired({"select": {"driver": "ice"}, "numvfs": 8, "vf": [{"index": "0-7", "vlan": 7}]})
    actions = plan(d, MIXED, PlanState())
    [write] = [a for a in actions if isinstance(a, SetVfSettings)]
    assert write.obj == "sriov pci=0000:5e:00.0"
    assert {(c.vf, c.attr, c.new) for c in write.changes} == {(i, "vlan", 7) for i in range(8)}


@pytest.mark.parametrize(
    ("vfs", "error"),
    [
        ([{"index": "0-3"}, {"index": "3-5"}], "VFs '3-5' overlap VFs '0-3'"),
        ([{"index": "4-9"}], "VFs '4-9' run past the last VF with numvfs = 8"),
        ([{"index": "rest"}, {"index": "REST"}], "VFs 'rest' is declared twice"),
        ([{"index": "7-3"}], 'want a VF index (3), a range ("0-7") or "rest"'),
        ([{"index": "0-1", "mac": "02:00:00:00:00:01"}], "would all get MAC 02:00:00:00:00:01"),
        ([{"index": "0-1", "node_guid": "00:11:22:33:44:55:66:77"}], "would all get one GUID"),
    ],
)
def test_bad_ranges_are_refused(vfs: list[dict[str, object]], error: str) -> None:
    with pytest.raises(SpecError, match=re.escape(error)):
        desired({"pf": {"pci": "0000:3b:00.0"}, "numvfs": 8, "vf": vfs})


def test_a_vf_block_and_its_range_that_disagree_block_that_vf_only() -> None:
    d = desired(
        {
            "pf": {"pci": "0000:3b:00.0"},
            "numvfs": 2,
            "vf": [{"index": "0-1", "max_tx_rate": 1000}, {"index": 0, "min_tx_rate": 2000}],
        }
    )
    [target] = resolve(d, MIXED).targets
    assert [v.index for v in target.vfs] == [1]
    [note] = target.notes
    assert isinstance(note, Blocked) and note.vfs == (0,)
    assert "min_tx_rate 2000 is above max_tx_rate 1000" in note.reason


# --- derived MACs ---------------------------------------------------------------------------


def test_derived_macs_follow_the_documented_formula() -> None:
    # sha256("rdmad-vf-mac pf-mac=b8:ce:f6:00:00:10 vf=0")[:6], first byte's low bits 10
    raw = hashlib.sha256(b"rdmad-vf-mac pf-mac=b8:ce:f6:00:00:10 vf=0").digest()[:6]
    want = ":".join(f"{b:02x}" for b in bytes([(raw[0] & 0xFC) | 2]) + raw[1:])
    assert derive_mac("pf-mac", vf=0, pf_mac="B8:CE:F6:00:00:10") == want
    raw = hashlib.sha256(
        f"rdmad-vf-mac machine-id={MACHINE_ID} pf=0000:3b:00.0 vf=5".encode()
    ).digest()[:6]
    want = ":".join(f"{b:02x}" for b in bytes([(raw[0] & 0xFC) | 2]) + raw[1:])
    assert derive_mac("machine-id", vf=5, machine_id=MACHINE_ID, pf="0000:3b:00.0") == want


def fleet_file(derive: str) -> Desired:
    return desired(
        {
            "select": {"vendor": ["15b3", "8086"]},
            "numvfs": 16,
            "vf": [{"index": "rest", "mac": {"derive": derive}}],
        }
    )


@pytest.mark.parametrize("derive", ["pf-mac", "machine-id"])
def test_derived_macs_are_stable_unique_unicast_and_local(derive: str) -> None:
    obs = node(CX5_0, CX5_1, replace(E810, totalvfs=16))
    first = resolve(fleet_file(derive), obs)
    again = resolve(fleet_file(derive), obs)  # another pass, a reboot: the same inputs
    macs = [v.mac for t in first.targets for v in t.vfs]
    assert macs == [v.mac for t in again.targets for v in t.vfs]
    assert len(macs) == 48 and len(set(macs)) == 48
    for mac in macs:
        assert mac is not None and MAC_RE.match(mac)
        assert int(mac[:2], 16) & 0b11 == 0b10  # unicast, locally administered
    assert all(t.derived == frozenset(range(16)) for t in first.targets)


def test_pf_mac_follows_the_card_and_machine_id_follows_the_node() -> None:
    moved = replace(CX5_0, pci="0000:af:00.0")  # the card in another slot
    by_card = [resolve(fleet_file("pf-mac"), node(p)).targets[0].vfs[3].mac for p in (CX5_0, moved)]
    assert by_card[0] == by_card[1]
    by_node = [
        resolve(fleet_file("machine-id"), node(CX5_0, machine_id=m)).targets[0].vfs[3].mac
        for m in (MACHINE_ID, "0" * 31 + "1")
    ]
    assert by_node[0] != by_node[1]


def test_plan_status_and_detail_show_the_derived_mac_as_an_address() -> None:
    d = desired(
        {
            "select": {"driver": "ice"},
            "numvfs": 8,
            "vf": [{"index": 2, "mac": {"derive": "pf-mac"}}],
        }
    )
    want = derive_mac("pf-mac", vf=2, pf_mac=E810.perm_mac)
    actions = plan(d, MIXED, PlanState())
    [write] = [a for a in actions if isinstance(a, SetVfSettings)]
    assert [(c.vf, c.attr, c.new) for c in write.changes] == [(2, "mac", want)]
    detail = describe(d, MIXED, actions)["sriov pci=0000:5e:00.0"]
    assert detail.desired["derived_macs"] == [2]
    [vf2] = [v for v in detail.vfs if v.vf == 2]
    assert [(a.name, a.desired) for a in vf2.attributes] == [("mac", want)]
    # Once set, the VF reads as declared: converged.
    done = node(
        replace(
            E810,
            vfs=tuple(
                replace(v, settings=VfSettings(mac=want)) if v.index == 2 else v for v in E810.vfs
            ),
        )
    )
    assert [a for a in plan(d, done, PlanState()) if a.changes_kernel] == []


def test_a_pf_without_a_permanent_mac_blocks_only_the_vfs_that_derive_from_it() -> None:
    d = desired(
        {
            "select": {"driver": "netdevsim"},
            "numvfs": 2,
            "vf": [{"index": 0, "mac": {"derive": "pf-mac"}, "vlan": 5}, {"index": 1, "vlan": 6}],
        }
    )
    nsim = replace(NSIM, perm_mac="00:00:00:00:00:00", numvfs=2)
    nsim = replace(nsim, vfs=make_vfs(nsim, 2))
    actions = plan(d, node(nsim), PlanState())
    [blocked] = [a for a in actions if isinstance(a, Blocked)]
    assert blocked.vfs == (0,) and "does not report" in blocked.reason
    assert 'derive = "machine-id" needs none' in blocked.reason
    [write] = [a for a in actions if isinstance(a, SetVfSettings)]
    assert {(c.vf, c.attr) for c in write.changes} == {(0, "vlan"), (1, "vlan")}


def test_no_machine_id_blocks_the_vfs_that_derive_from_it() -> None:
    target = resolve(fleet_file("machine-id"), node(CX5_0, machine_id=None)).targets[0]
    assert all(v.mac is None for v in target.vfs)
    assert len(target.notes) == 16 and "/etc/machine-id" in target.notes[0].reason


def test_two_pfs_that_share_a_permanent_mac_are_refused_naming_both_vfs() -> None:
    twin = replace(CX5_1, perm_mac=CX5_0.perm_mac)
    d = desired(
        {
            "select": {"vendor": "15b3"},
            "numvfs": 16,
            "vf": [{"index": 3, "mac": {"derive": "pf-mac"}}],
        }
    )
    actions = plan(d, node(CX5_0, twin), PlanState())
    blocked = [a for a in actions if isinstance(a, Blocked)]
    assert [b.obj for b in blocked] == ["sriov pci=0000:3b:00.0", "sriov pci=0000:3b:00.1"]
    for b in blocked:
        assert b.vfs == (3,)
        assert "VF 3 of 0000:3b:00.0 and VF 3 of 0000:3b:00.1 would all get MAC" in b.reason
        assert 'derive = "machine-id" tells them apart' in b.reason
    assert not any(
        isinstance(a, SetVfSettings) and any(c.attr == "mac" for c in a.changes) for a in actions
    )


def test_a_literal_mac_equal_to_a_derived_one_is_refused_on_both() -> None:
    taken = derive_mac("pf-mac", vf=0, pf_mac=CX5_0.perm_mac)
    d = desired(
        {
            "pf": {"pci": "0000:3b:00.0"},
            "numvfs": 2,
            "vf": [{"index": 0, "mac": {"derive": "pf-mac"}}],
        },
        {"pf": {"pci": "0000:5e:00.0"}, "numvfs": 8, "vf": [{"index": 1, "mac": taken}]},
    )
    res = resolve(d, MIXED)
    assert [len(t.notes) for t in res.targets] == [1, 1]
    assert all(v.mac is None for t in res.targets for v in t.vfs)


def test_a_literal_mac_repeated_across_pfs_is_still_allowed() -> None:
    """A VM's failover bond: one MAC on a VF of each port (as before selectors)."""
    d = desired(
        {
            "pf": {"pci": "0000:3b:00.0"},
            "numvfs": 2,
            "vf": [{"index": 0, "mac": "02:00:00:00:00:09"}],
        },
        {
            "pf": {"pci": "0000:3b:00.1"},
            "numvfs": 2,
            "vf": [{"index": 0, "mac": "02:00:00:00:00:09"}],
        },
    )
    assert all(t.notes == () for t in resolve(d, MIXED).targets)


def test_a_bad_derivation_is_refused() -> None:
    with pytest.raises(SpecError, match="derive: must be one of 'pf-mac', 'machine-id'"):
        desired(
            {
                "pf": {"pci": "0000:3b:00.0"},
                "numvfs": 1,
                "vf": [{"index": 0, "mac": {"derive": "random"}}],
            }
        )


# --- the kernel layer: what selectors match on -----------------------------------------------


def test_observe_reads_pci_ids_and_the_machine_id(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.pf("0000:3b:00.0", "mlx5_core", totalvfs=8)
    fs.write("sys/devices/pci0000:00/0000:3b:00.0/vendor", "0x15b3")
    fs.write("sys/devices/pci0000:00/0000:3b:00.0/device", "0x1017")
    fs.pf("0000:01:00.0", "igb", totalvfs=7)
    fs.write("sys/devices/pci0000:00/0000:01:00.0/vendor", "0x8086")
    fs.write("sys/devices/pci0000:00/0000:01:00.0/device", "0x10c9")
    fs.write("etc/machine-id", MACHINE_ID.upper())
    obs = observe(Sysfs(tmp_path))
    assert {(p.pci, p.vendor, p.device, p.driver) for p in obs.pfs} == {
        ("0000:3b:00.0", "15b3", "1017", "mlx5_core"),
        ("0000:01:00.0", "8086", "10c9", "igb"),
    }
    assert obs.machine_id == MACHINE_ID
    d = desired({"select": {"vendor": "8086", "device": "10c9", "driver": "igb"}, "numvfs": 7})
    assert [a.pci for a in plan(d, obs, PlanState()) if isinstance(a, SetNumVfs)] == [
        "0000:01:00.0"
    ]


def test_an_uninitialized_machine_id_is_none(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.write("etc/machine-id", "uninitialized")
    assert Sysfs(tmp_path).machine_id() is None


# --- the documented fleet file -----------------------------------------------------------------


def readme_fleet_file() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n### One file for a fleet\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```toml\n(.*?)^```$", section, re.S | re.M)
    return str(block)


def test_the_readme_fleet_file_passes_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(readme_fleet_file())
    path.chmod(0o644)
    assert cli.main(["check-config", "--config", str(path)]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith(f"config OK: {path}")


def test_the_readme_fleet_file_on_a_mixed_node() -> None:
    d = validate(Desired, tomllib.loads(readme_fleet_file()))
    obs = node(CX5_0, CX5_1, IGB)  # ConnectX-5 ports and an igb, no E810
    actions = plan(d, obs, PlanState())
    statuses = {s.obj: s for s in summarize(declared_objects(d, obs), actions)}
    assert set(statuses) == {
        "sriov pci=0000:3b:00.0",
        "sriov pci=0000:3b:00.1",
        "sriov select:driver=ice,pci_path=0000:3b:*",
    }
    assert statuses["sriov select:driver=ice,pci_path=0000:3b:*"].state is ObjectState.CONVERGED
    [target] = [t for t in resolve(d, obs).targets if t.ref.pci == "0000:3b:00.0"]
    assert [(v.index, v.vlan) for v in target.vfs][:2] == [(0, 101), (1, 100)]


def test_the_node_docs_show_the_readmes_table_of_what_each_tool_matches_on() -> None:
    """docs/CONFIG.md is shipped to the node, README.md is not: the same table, line for
    line, so neither falls behind the other."""

    def table(text: str) -> list[str]:
        start = text.index("What each tool matches a PF on:")
        lines = text[start:].split("\n\n", 2)[1].splitlines()  # the paragraph after it
        return [ln for ln in lines if ln.startswith("|")]

    readme = table((ROOT / "README.md").read_text())
    assert len(readme) >= 10 and readme[0].startswith("| | rdmad `select`")
    assert table((ROOT / "docs" / "CONFIG.md").read_text()) == readme
