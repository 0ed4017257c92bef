"""SR-IOV policy: VF counts (through 0, never under a VF in use), VF settings (batched
per PF; drift on an in-use VF reported, the InfiniBand port policy included; refused
attributes remembered), VF drivers and InfiniBand identities (re-bound only when free)."""

from __future__ import annotations

from collections.abc import Iterator

from rdmad import pfselect
from rdmad.model import (
    NO_DRIVER,
    Action,
    BindVfDriver,
    Blocked,
    InUseDrift,
    InUseDriftPolicy,
    Note,
    Observed,
    PfObserved,
    PlanState,
    SetAutoprobe,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetVfSettings,
    SriovSpec,
    Unsupported,
    UnsupportedKey,
    VfChange,
    VfObserved,
    VfSettings,
    VfSpec,
    Waiting,
    format_value,
)
from rdmad.reconcile.eswitch import plan_eswitch
from rdmad.reconcile.resolve import SriovTarget, find_pf

# PF drivers that create VFs only while the PF netdev is up (FIELD.md: bnxt).
PF_UP_DRIVERS = frozenset({"bnxt_en"})

# VfSpec attributes that travel in rtnetlink IFLA_VFINFO_LIST, in VfSettings order.
NETLINK_ATTRS: tuple[str, ...] = VfSettings.__struct_fields__
IB_ATTRS: tuple[str, ...] = ("node_guid", "port_guid", "policy")
DEFAULT_VLAN_PROTO = "802.1Q"


# --- SR-IOV ---------------------------------------------------------------------------


def plan_sriov(
    target: SriovTarget, observed: Observed, state: PlanState, claimed: dict[str, str]
) -> list[Action]:
    obj, spec = target.obj, target.spec
    pf = find_pf(target.ref, observed)
    if isinstance(pf, str):
        return [Blocked(obj, pf)]
    if pf is None:
        return [Waiting(obj, f"{target.ref.describe()} is not present (no SR-IOV capable device)")]
    if pf.pci in claimed:
        return [Blocked(obj, f"{pf.pci} is already declared as {claimed[pf.pci]!r}")]
    claimed[pf.pci] = obj
    held = other_managers(obj, spec, pf)
    if held is not None and isinstance(held, Blocked):
        return [held]
    overrides: list[Action] = [] if held is None else [held]
    if spec.numvfs > pf.totalvfs:
        return [
            Blocked(
                obj,
                f"numvfs {spec.numvfs} exceeds sriov_totalvfs {pf.totalvfs} of {pf.pci}",
            )
        ]
    if pf.driver is None:
        # The kernel refuses sriov_numvfs without a PF driver (ENOENT); the driver's
        # bind event starts the next pass, so waiting costs nothing.
        if pf.udev_unread:
            why = f"{pfselect.pending_words([pf.pci], pf.udev_unread)}: waiting as if it had not"
        elif pf.udev_pending:
            why = f"{pf.pci} has no driver bound yet: udev has not processed it (at boot)"
        else:
            why = f"{pf.pci} has no driver bound (PF driver unloaded?)"
        return [Waiting(obj, why)]
    # Before VFs are made: the eSwitch mode decides their vports and representors,
    # autoprobe their binding.
    # A VF whose MAC could not be had (not derivable here, not unique) says so first.
    first = [*overrides, *target.notes]
    first += plan_eswitch(obj, spec.eswitch, pf, state) + _autoprobe(obj, spec, pf)
    if pf.numvfs != spec.numvfs:
        return first + _plan_numvfs(obj, target, pf, state)

    actions: list[Action] = first
    netlink_changes: list[VfChange] = []
    for vf_spec in target.vfs:
        vf = pf.vf(vf_spec.index)
        if vf is None or vf.pci is None:
            actions.append(
                Waiting(
                    obj,
                    f"VF {vf_spec.index} of {pf.pci} has not appeared yet",
                    vfs=(vf_spec.index,),
                )
            )
            continue
        actions.extend(_plan_vf_binding(obj, spec, pf, vf_spec, vf, observed))
        changes, notes = _netlink_changes(obj, spec, pf, vf_spec, vf, state)
        actions.extend(notes)
        netlink_changes.extend(changes)
    if netlink_changes:
        if pf.netdev is None:
            actions.append(
                Blocked(obj, f"{pf.pci} has no netdev: VF settings are set through the PF's netdev")
            )
        else:
            actions.append(_settings(obj, pf, "restore declared settings of", netlink_changes))
    return actions


def other_managers(obj: str, spec: SriovSpec, pf: PfObserved) -> Blocked | Note | None:
    """Another network manager declares SR-IOV for the PF (or whether one does is
    unknown): rdmad holds every write to it (the count, the eSwitch, autoprobe, the VFs'
    settings and drivers) rather than undo the other's at each event and be undone in
    turn, unless the config gives the PF to rdmad (``owner = "rdmad"``: a note says so)."""
    seen = pf.managers
    if seen is None or not seen.contested:
        return None
    if spec.owner == "rdmad":
        return Note(obj, f'owner = "rdmad" overrides: {seen.describe()}; rdmad manages it anyway')
    return Blocked(
        obj,
        f'held: {seen.describe()}; set owner = "rdmad" in its [[sriov]] to take it over',
    )


def _autoprobe(obj: str, spec: SriovSpec, pf: PfObserved) -> list[Action]:
    """sriov_drivers_autoprobe as declared. It changes nothing for VFs that exist (they
    keep their driver), so it is never held back by one in use."""
    want = spec.autoprobe
    if want is not None and pf.autoprobe_unread is not None:
        return [Blocked(obj, f"sriov_drivers_autoprobe is unknown: {pf.autoprobe_unread}")]
    if want is None or want == pf.drivers_autoprobe:
        return []
    if pf.drivers_autoprobe is None:
        return [Blocked(obj, f"{pf.pci} has no sriov_drivers_autoprobe (driver {pf.driver})")]
    why = "VFs are bound by their declared driver only" if not want else "declared"
    return [SetAutoprobe(obj, why, pci=pf.pci, old=pf.drivers_autoprobe, new=want)]


def _plan_numvfs(obj: str, target: SriovTarget, pf: PfObserved, state: PlanState) -> list[Action]:
    spec = target.spec
    actions = _numvfs_steps(obj, spec, pf)
    creates = any(isinstance(a, SetNumVfs) and a.new > 0 for a in actions)
    if creates and spec.autoprobe is not None and pf.autoprobe_unread is not None:
        # VFs made before autoprobe is known to be as declared may be bound by the PF
        # driver's VF driver first: what declaring it is meant to prevent.
        return [
            Blocked(
                obj,
                f"numvfs {pf.numvfs} -> {spec.numvfs} waits until sriov_drivers_autoprobe "
                "can be read",
            )
        ]
    if creates:
        actions.extend(_new_vf_settings(obj, target, pf, state))
    if creates and pf.driver in PF_UP_DRIVERS and pf.operstate_up is False and pf.netdev:
        if pf.udev_pending:
            # Up, it could not be renamed (EBUSY before Linux 6.2; udev before systemd
            # 253 does not try): the name the network's configuration expects would
            # never come. udev's event for it starts the next pass.
            named = (
                f"whether udev has named {pf.netdev} is unknown ({pf.udev_unread} could not "
                "be read)"
                if pf.udev_unread
                else f"udev has not named {pf.netdev} yet"
            )
            why = (
                f"{pf.driver} creates VFs only while the PF is up, and {named} (before "
                "Linux 6.2 an interface that is up cannot be renamed)"
            )
            return [Waiting(obj, why)]
        why = f"{pf.driver} creates VFs only while the PF is up"
        return [SetLinkUp(obj, why, netdev=pf.netdev), *actions]
    return actions


def _new_vf_settings(
    obj: str, target: SriovTarget, pf: PfObserved, state: PlanState
) -> list[Action]:
    """The declared rtnetlink settings of the VFs a numvfs write creates, sent right after it.

    VFs that did not exist hold nothing and carry the driver's defaults, so there is
    nothing to read first: waiting for another pass to observe them (a full observation
    and a plan) would be most of a restore's time. The write's read-back and the
    follow-up pass verify them, and plan whatever else they need (drivers, GUIDs). An
    attribute the driver refused before is left to that pass too, which says so.
    """
    if pf.netdev is None:
        return []  # the follow-up pass says why nothing can be set (Blocked)
    changes: list[VfChange] = []
    for vf_spec in target.vfs:
        if vf_spec.index >= target.spec.numvfs:
            continue
        wanted, implied = netlink_wanted(vf_spec)
        for attr, new in wanted:
            if implied and attr == "vlan_proto":
                # Not declared: the VLAN write sends 802.1Q with the VLAN anyway (a new VF
                # reads no protocol), and a plan shows only what the operator declared.
                continue
            key = UnsupportedKey(pf.pci, pf.driver or "", vf_spec.index, attr, format_value(new))
            if key not in state.unsupported:
                changes.append(VfChange(vf_spec.index, attr, None, new))
    if not changes:
        return []
    return [_settings(obj, pf, "set declared settings of new", changes)]


def _settings(obj: str, pf: PfObserved, words: str, changes: list[VfChange]) -> SetVfSettings:
    """One batched write of VF settings to the PF, by ifindex, naming its VFs in spans."""
    assert pf.netdev is not None
    return SetVfSettings(
        obj,
        f"{words} {_vf_list({c.vf for c in changes})}",
        pci=pf.pci,
        pf_netdev=pf.netdev,
        pf_ifindex=pf.ifindex,
        changes=tuple(changes),
    )


def _numvfs_steps(obj: str, spec: SriovSpec, pf: PfObserved) -> list[Action]:
    old, new = pf.numvfs, spec.numvfs
    if old == 0:
        return [SetNumVfs(obj, f"restore {new} VFs", pci=pf.pci, old=0, new=new)]
    busy = [v for v in pf.vfs if v.vport_busy]
    # Any change of a non-zero count destroys every VF (the kernel requires 0 in between),
    # and in switchdev mode its representor with it.
    if busy:
        held = "; ".join(f"VF {v.index} ({v.pci}): {v.vport_holders()}" for v in busy)
        return [
            Blocked(
                obj,
                f"numvfs {old} -> {new} would destroy VFs in use: {held}",
                vfs=tuple(v.index for v in busy),
            )
        ]
    if len(pf.vfs) < old:
        return [
            Blocked(
                obj,
                f"numvfs {old} -> {new}: only {len(pf.vfs)} of {old} VFs are visible, "
                "so whether the others are in use is unknown",
            )
        ]
    if new == 0:
        return [SetNumVfs(obj, f"declared numvfs is 0 (was {old})", pci=pf.pci, old=old, new=0)]
    return [
        SetNumVfs(obj, f"numvfs {old} -> {new} must pass through 0", pci=pf.pci, old=old, new=0),
        SetNumVfs(obj, f"numvfs {old} -> {new}", pci=pf.pci, old=0, new=new),
    ]


def _netlink_changes(
    obj: str,
    pf_spec: SriovSpec,
    pf: PfObserved,
    spec: VfSpec,
    vf: VfObserved,
    state: PlanState,
) -> tuple[list[VfChange], list[Action]]:
    """The rtnetlink changes one VF needs, and notes on the ones it does not get.

    A change the PF's driver refused as unsupported (``state.unsupported``) is not
    planned again until the config or the driver changes. A VF in use is not
    rewritten unless its declaration opts in (``in_use_drift = "apply"``).
    """
    wanted, implied = netlink_wanted(spec)
    if not wanted:
        return [], []
    if vf.settings is None:
        why = pf.settings_note or "the kernel did not report them"
        return [], [Waiting(obj, f"settings of VF {vf.index} are unknown: {why}", vfs=(vf.index,))]
    changes: list[VfChange] = []
    notes: list[Action] = []
    refused = {k: k for k in state.unsupported if k.pci == pf.pci and k.vf == vf.index}
    for attr, new in wanted:
        old = getattr(vf.settings, attr)
        if netlink_matches(attr, old, new, implied):
            continue
        key = UnsupportedKey(pf.pci, pf.driver or "", vf.index, attr, format_value(new))
        if key in refused:
            said = refused[key].error or "refused"
            notes.append(
                Unsupported(
                    obj,
                    f"VF {vf.index} {attr} = {format_value(new)}: not supported by "
                    f"{pf.driver or 'the PF driver'} ({said}); not retried until the config "
                    "or the driver changes",
                    vf=vf.index,
                    attr=attr,
                )
            )
            continue
        changes.append(VfChange(vf.index, attr, old, new))
    if changes and vf.usage.busy and in_use_drift(pf_spec, spec) != "apply":
        notes.append(_in_use_drift(obj, vf, changes))
        return [], notes
    return changes, notes


def in_use_drift(pf_spec: SriovSpec, spec: VfSpec) -> InUseDriftPolicy:
    """What to do with a VF in use that differs: the VF's own setting, else its PF's."""
    return spec.in_use_drift or pf_spec.in_use_drift


def _in_use_drift(obj: str, vf: VfObserved, changes: list[VfChange]) -> InUseDrift:
    """The note for changes left undone because the VF is in use (one per VF and kind)."""
    what = ", ".join(
        f"{c.attr} {format_value(c.old)} (declared {format_value(c.new)})" for c in changes
    )
    return InUseDrift(
        obj,
        f"VF {vf.index} ({vf.pci}) differs: {what}; left alone because it is in use: "
        f'{vf.usage.describe()} (in_use_drift = "apply" rewrites it)',
        vf=vf.index,
        attr=",".join(c.attr for c in changes),
    )


def netlink_wanted(spec: VfSpec) -> tuple[list[tuple[str, object]], bool]:
    """The rtnetlink attributes a VF declares (in VfSettings order) with their values, and
    whether ``vlan_proto`` among them is implied rather than declared."""
    wanted: list[tuple[str, object]] = [
        (a, getattr(spec, a)) for a in NETLINK_ATTRS if getattr(spec, a) is not None
    ]
    implied = bool(spec.vlan) and spec.vlan_proto is None
    if implied:
        # A VLAN declared without a protocol means 802.1Q, as with `ip link set ... vlan V`
        # and systemd-networkd; a VF reading another (or an unknown) one is moved to it.
        # vlan = 0 is "no VLAN": its protocol means nothing and is left as it reads.
        wanted.append(("vlan_proto", DEFAULT_VLAN_PROTO))
    return wanted, implied


def netlink_matches(attr: str, old: object, new: object, implied: bool) -> bool:
    """A VF's rtnetlink attribute reads as declared: equal, or an implied protocol the
    kernel does not report (nothing to compare)."""
    return old == new or (implied and attr == "vlan_proto" and old is None)


def ib_wanted(spec: VfSpec) -> list[tuple[str, object]]:
    """The InfiniBand identity attributes a VF declares, with their values."""
    return [(a, getattr(spec, a)) for a in IB_ATTRS if getattr(spec, a) is not None]


def _plan_vf_binding(
    obj: str,
    pf_spec: SriovSpec,
    pf: PfObserved,
    spec: VfSpec,
    vf: VfObserved,
    observed: Observed,
) -> Iterator[Action]:
    assert vf.pci is not None
    rebind_driver = spec.driver is not None and not bound_as_declared(spec.driver, vf)
    ib_changes = _ib_changes(spec, vf)
    if ib_changes is None:
        yield Blocked(
            obj,
            f"VF {vf.index}: node_guid/port_guid/policy need an InfiniBand PF; "
            f"{pf.pci} has no IB SR-IOV controls",
            vfs=(vf.index,),
        )
        ib_changes = []
    needs_rebind = any(c.attr != "policy" for c in ib_changes) or rebind_driver
    if needs_rebind and vf.usage.busy:
        what = "bind to " + str(spec.driver) if rebind_driver else "apply new GUIDs"
        yield Blocked(
            obj,
            f"VF {vf.index} ({vf.pci}) must be re-bound to {what}, "
            f"but it is in use: {vf.usage.describe()}",
            vfs=(vf.index,),
        )
        # The policy alone needs no rebind: it follows in_use_drift below.
        ib_changes = [c for c in ib_changes if c.attr == "policy"]
        rebind_driver = False
        needs_rebind = False
    if ib_changes and vf.usage.busy and in_use_drift(pf_spec, spec) != "apply":
        # Only the policy is left here (a GUID needs a re-bind, blocked above). It is a
        # VF setting like the rtnetlink ones: "Down" takes the VM's IB port down, so a
        # VF in use keeps its policy unless its declaration opts in.
        yield _in_use_drift(obj, vf, ib_changes)
        ib_changes = []
    if ib_changes:
        yield SetIbVf(
            obj,
            f"restore InfiniBand identity of VF {vf.index}",
            pci=pf.pci,
            ib_device=pf.ib_device or "",
            vf=vf.index,
            vf_pci=vf.pci,
            changes=tuple(ib_changes),
            # A driver change re-binds anyway; do it once.
            rebind=needs_rebind and not rebind_driver,
            vf_driver=vf.driver,
        )
    if rebind_driver and spec.driver is not None:
        unbound = spec.driver == NO_DRIVER
        yield BindVfDriver(
            obj,
            f"VF {vf.index} is declared unbound (driver = none)"
            if unbound
            else f"VF {vf.index} is declared with driver {spec.driver}",
            vf_pci=vf.pci,
            old=vf.driver,
            new=spec.driver,
            override_old=vf.driver_override,
            load_module=not unbound and _module_name(spec.driver) not in observed.modules.loaded,
        )


def bound_as_declared(driver: str, vf: VfObserved) -> bool:
    """Bound to the declared driver, or (driver = none) unbound and kept so by
    driver_override, so that a re-probe after a PF reset does not bind it again."""
    if driver == NO_DRIVER:
        return vf.driver is None and vf.driver_override == NO_DRIVER
    return vf.driver == driver


def _module_name(driver: str) -> str:
    """The module a PCI driver comes from, as /proc/modules spells it (vfio-pci -> vfio_pci)."""
    return driver.replace("-", "_")


def _ib_changes(spec: VfSpec, vf: VfObserved) -> list[VfChange] | None:
    wanted = ib_wanted(spec)
    if not wanted:
        return []
    if vf.ib is None:
        return None
    return [
        VfChange(vf.index, attr, getattr(vf.ib, attr), new)
        for attr, new in wanted
        if getattr(vf.ib, attr) != new
    ]


def _vf_list(indexes: set[int]) -> str:
    """'VF 0, VF 3' for a few; '64 VFs (0-63)' for many: one reason is logged per write."""
    ordered = sorted(indexes)
    if len(ordered) <= 4:
        return ", ".join(f"VF {i}" for i in ordered)
    runs: list[list[int]] = []
    for i in ordered:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    spans = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)
    return f"{len(ordered)} VFs ({spans})"
