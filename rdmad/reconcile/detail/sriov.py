"""The status detail of an SR-IOV object: its VF count, each VF present or declared, and
each declared attribute of each VF, against what the plan does about it.

Compares declared with observed values through the planner's own helpers
(``rdmad.reconcile.sriov``), so status and plan never disagree on what "converged" means.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from rdmad.model import (
    PF_ATTR,
    Action,
    AttrStatus,
    BindVfDriver,
    Blocked,
    InUseDrift,
    ObjectDetail,
    ObjectState,
    Observed,
    PfObserved,
    SetAutoprobe,
    SetEswitch,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetVfSettings,
    SriovSpec,
    Unsupported,
    VfObserved,
    VfSpec,
    VfStatus,
    Waiting,
)
from rdmad.reconcile.detail.verdicts import CONVERGED, DIFFERS, NOT_PRESENT, Verdict, worst
from rdmad.reconcile.resolve import SriovTarget, find_pf
from rdmad.reconcile.sriov import (
    bound_as_declared,
    ib_wanted,
    netlink_matches,
    netlink_wanted,
)


class _SriovPlan(msgspec.Struct):
    """One SR-IOV object's actions, indexed by what they are about."""

    changes: dict[tuple[int, str], str] = msgspec.field(
        default_factory=dict
    )  # (vf, attr) -> reason
    binds: dict[str, str] = msgspec.field(default_factory=dict)  # VF PCI address -> reason
    notes: dict[tuple[int, str], Verdict] = msgspec.field(default_factory=dict)  # (vf, attr)
    vf_blocked: dict[int, str] = msgspec.field(default_factory=dict)
    vf_waiting: dict[int, str] = msgspec.field(default_factory=dict)
    blocked: str | None = None  # about the object, not one VF
    waiting: str | None = None
    any_blocked: str | None = None  # the first Blocked, whatever it is about
    any_waiting: str | None = None
    count_step: str | None = None  # SetNumVfs / SetLinkUp
    autoprobe_step: str | None = None  # SetAutoprobe
    eswitch_step: str | None = None  # SetEswitch

    @classmethod
    def read(cls, actions: Iterable[Action]) -> _SriovPlan:
        p = cls()
        for a in actions:
            if isinstance(a, SetVfSettings | SetIbVf):
                for c in a.changes:
                    p.changes.setdefault((c.vf, c.attr), a.reason)
            elif isinstance(a, BindVfDriver):
                p.binds.setdefault(a.vf_pci, a.reason)
            elif isinstance(a, Unsupported | InUseDrift):
                state = (
                    ObjectState.UNSUPPORTED
                    if isinstance(a, Unsupported)
                    else ObjectState.DRIFT_IN_USE
                )
                # InUseDrift names every attribute that differs, comma-separated.
                for attr in a.attr.split(","):
                    p.notes.setdefault((a.vf, attr), (state, a.reason))
            elif isinstance(a, Blocked):
                p.any_blocked = p.any_blocked or a.reason
                if not a.vfs:
                    p.blocked = p.blocked or a.reason
                for vf in a.vfs:
                    p.vf_blocked.setdefault(vf, a.reason)
            elif isinstance(a, Waiting):
                p.any_waiting = p.any_waiting or a.reason
                if not a.vfs:
                    p.waiting = p.waiting or a.reason
                for vf in a.vfs:
                    p.vf_waiting.setdefault(vf, a.reason)
            elif isinstance(a, SetNumVfs | SetLinkUp):
                p.count_step = p.count_step or a.reason
            elif isinstance(a, SetAutoprobe):
                p.autoprobe_step = a.reason
            elif isinstance(a, SetEswitch):
                p.eswitch_step = a.reason
        return p


def sriov_detail(
    target: SriovTarget, observed: Observed, actions: Iterable[Action]
) -> ObjectDetail:
    spec = target.spec
    found = find_pf(target.ref, observed)
    pf = found if isinstance(found, PfObserved) else None
    plan = _SriovPlan.read(actions)
    numvfs = _numvfs(spec, pf, plan)
    present = {v.index: v for v in pf.vfs} if pf is not None else {}
    declared = {v.index: v for v in target.vfs}
    # Where a selector or a derived MAC decided something, status says which.
    fleet: dict[str, object] = {}
    if target.select is not None:
        fleet["select"] = target.select.key()
    if target.derived:
        fleet["derived_macs"] = sorted(target.derived)
    vfs = tuple(
        _vf(i, declared.get(i), present.get(i), plan, numvfs)
        for i in sorted(declared.keys() | present.keys())
    )
    return ObjectDetail(
        kind="sriov",
        desired={
            "pf": target.ref.key(),
            **fleet,
            "numvfs": spec.numvfs,
            "driver_guard": spec.driver_guard,
            "in_use_drift": spec.in_use_drift,
            "autoprobe": spec.autoprobe,
            "eswitch": None if spec.eswitch is None else _declared_eswitch(spec),
            "owner": spec.owner,
        },
        observed={}
        if pf is None
        else {
            "pci": pf.pci,
            "netdev": pf.netdev,
            "driver": pf.driver,
            "numvfs": pf.numvfs,
            "totalvfs": pf.totalvfs,
            "autoprobe": pf.drivers_autoprobe,
            "up": pf.operstate_up,
            "guard": guard_state(spec, pf, observed),
            # Other network managers' SR-IOV declarations for it (None: not looked at).
            "managers": None if pf.managers is None else pf.managers.to_json(),
            **_seen_eswitch(pf),
        },
        attributes=(numvfs, *_eswitch(spec, pf, plan), *_autoprobe(spec, pf, plan)),
        vfs=vfs,
    )


def guard_state(spec: SriovSpec, pf: PfObserved, observed: Observed) -> str:
    """Whether `modprobe -r` of this PF's driver asks the guard first, in a few words."""
    hook = observed.guard_hook
    if not spec.driver_guard:
        return "off (driver_guard = false)"
    if hook is None:
        return "unknown (the hook file was not read)"
    if pf.driver is None:
        return "waiting for the PF's driver"
    if pf.driver_module is None:
        return f"not needed ({pf.driver} is built in: it cannot be unloaded)"
    if pf.driver_module in hook.modules and hook.current:
        return f"installed (modprobe -r {pf.driver_module} asks the guard)"
    return f"not installed yet for {pf.driver_module}"


def _declared_eswitch(spec: SriovSpec) -> dict[str, str]:
    assert spec.eswitch is not None
    options = ("mode", "inline_mode", "encap_mode")
    return {o: v for o in options if (v := getattr(spec.eswitch, o)) is not None}


def _seen_eswitch(pf: PfObserved) -> dict[str, object]:
    """The eSwitch as devlink showed it (or why not), and the VFs' representors."""
    seen = pf.eswitch
    if seen is None:
        return {}
    if seen.mode is None:
        return {"eswitch": {"unknown": seen.unread} if seen.unread else {"none": seen.absent}}
    shown = {"mode": seen.mode, "inline_mode": seen.inline_mode, "encap_mode": seen.encap_mode}
    reps = {str(v.index): v.representor for v in pf.vfs if v.representor is not None}
    return {
        "eswitch": {k: v for k, v in shown.items() if v is not None},
        **({"representors": reps} if reps else {}),
    }


def _eswitch(spec: SriovSpec, pf: PfObserved | None, plan: _SriovPlan) -> list[AttrStatus]:
    """Each declared eSwitch option against devlink's."""
    if spec.eswitch is None:
        return []
    seen = pf.eswitch if pf is not None else None
    out = []
    for option, want in _declared_eswitch(spec).items():
        now = getattr(seen, option) if seen is not None else None
        note = plan.notes.get((PF_ATTR, f"eswitch.{option}")) or plan.notes.get(
            (PF_ATTR, "eswitch")
        )
        verdict = note or _pf_verdict(now == want, plan.eswitch_step, plan)
        out.append(AttrStatus(f"eswitch.{option}", want, now, *verdict))
    return out


def _autoprobe(spec: SriovSpec, pf: PfObserved | None, plan: _SriovPlan) -> list[AttrStatus]:
    """sriov_drivers_autoprobe, when declared."""
    if spec.autoprobe is None:
        return []
    seen = pf.drivers_autoprobe if pf is not None else None
    verdict = _pf_verdict(seen == spec.autoprobe, plan.autoprobe_step, plan)
    return [AttrStatus("autoprobe", spec.autoprobe, seen, *verdict)]


def _pf_verdict(matches: bool, step: str | None, plan: _SriovPlan) -> Verdict:
    """A PF attribute set by an action of its own (``step``: its reason, when planned)."""
    if matches:
        return CONVERGED
    if step is not None:
        return (ObjectState.PENDING, step)
    if plan.blocked is not None:
        return (ObjectState.BLOCKED, plan.blocked)
    return (ObjectState.PENDING, plan.waiting or DIFFERS)


def _numvfs(spec: SriovSpec, pf: PfObserved | None, plan: _SriovPlan) -> AttrStatus:
    """The VF count. When it differs, the planner plans the count (or says why it cannot)
    and the settings of the VFs it creates, so every action of the object is about it."""
    if pf is not None and pf.numvfs == spec.numvfs:
        verdict = CONVERGED
    elif plan.count_step is not None:
        verdict = (ObjectState.PENDING, plan.count_step)
    elif plan.any_blocked is not None:
        verdict = (ObjectState.BLOCKED, plan.any_blocked)
    elif plan.any_waiting is not None:
        verdict = (ObjectState.PENDING, plan.any_waiting)
    else:
        verdict = (ObjectState.PENDING, DIFFERS)
    return AttrStatus(
        "numvfs", spec.numvfs, pf.numvfs if pf is not None else None, verdict[0], verdict[1]
    )


def _vf(
    index: int,
    spec: VfSpec | None,
    vf: VfObserved | None,
    plan: _SriovPlan,
    numvfs: AttrStatus,
) -> VfStatus:
    there = vf is not None and vf.pci is not None
    attrs: tuple[AttrStatus, ...] = ()
    own: list[Verdict] = []  # what the VF shows beyond its attributes
    if spec is not None:
        if there:
            assert vf is not None
            attrs = _vf_attrs(spec, vf, plan, numvfs)
        else:
            attrs = tuple(
                AttrStatus(name, want, None, ObjectState.PENDING, f"VF {index} {NOT_PRESENT}")
                for name, want in _declared(spec)
            )
            own.append((ObjectState.PENDING, NOT_PRESENT))
    if index in plan.vf_blocked:
        own.append((ObjectState.BLOCKED, plan.vf_blocked[index]))
    if index in plan.vf_waiting:
        own.append((ObjectState.PENDING, plan.vf_waiting[index]))
    # The VF's own verdicts first: "not present" explains its attributes' state.
    state, reason = worst([*own, *((a.state, a.reason) for a in attrs)])
    return VfStatus(
        vf=index,
        pci=vf.pci if vf is not None else None,
        netdev=vf.netdev if vf is not None else None,
        driver=vf.driver if vf is not None else None,
        state=state,
        reason=reason,
        usage=vf.usage.state.value if vf is not None else "free",
        holders=vf.usage.holders if vf is not None else (),
        attributes=attrs,
        representor=vf.representor if vf is not None else None,
    )


def _declared(spec: VfSpec) -> list[tuple[str, object]]:
    """Every attribute a VF declares, in the order status lists them (rtnetlink
    attributes, an implied vlan_proto among them, then driver, then InfiniBand)."""
    wanted, _ = netlink_wanted(spec)
    if spec.driver is not None:
        wanted.append(("driver", spec.driver))
    return wanted + ib_wanted(spec)


def _vf_attrs(
    spec: VfSpec, vf: VfObserved, plan: _SriovPlan, numvfs: AttrStatus
) -> tuple[AttrStatus, ...]:
    netlink, implied = netlink_wanted(spec)
    out: list[AttrStatus] = []
    settings = vf.settings
    for name, want in netlink:
        seen = getattr(settings, name) if settings is not None else None
        same = settings is not None and netlink_matches(name, seen, want, implied)
        out.append(_attr(name, want, seen, same, vf, plan, numvfs))
    if spec.driver is not None:
        same = bound_as_declared(spec.driver, vf)
        out.append(_attr("driver", spec.driver, vf.driver, same, vf, plan, numvfs))
    for name, want in ib_wanted(spec):
        seen = getattr(vf.ib, name) if vf.ib is not None else None
        out.append(_attr(name, want, seen, vf.ib is not None and seen == want, vf, plan, numvfs))
    return tuple(out)


def _attr(
    name: str,
    want: object,
    seen: object,
    same: bool,
    vf: VfObserved,
    plan: _SriovPlan,
    numvfs: AttrStatus,
) -> AttrStatus:
    """One attribute of a present VF: whether it reads as declared, else what the plan
    does about it, else why the plan leaves it (the VF's or the object's block or wait).

    Reading as declared comes first: the planner plans (or notes) only attributes that
    differ, so an equal one needs no look-up, and that is nearly every one on a node.
    """
    if same:
        return AttrStatus(name, want, seen, ObjectState.CONVERGED)
    key = (vf.index, name)
    verdict: Verdict
    if key in plan.notes:
        verdict = plan.notes[key]
    elif key in plan.changes:
        verdict = (ObjectState.PENDING, plan.changes[key])
    elif name == "driver" and vf.pci in plan.binds:
        verdict = (ObjectState.PENDING, plan.binds[vf.pci])
    elif vf.index in plan.vf_blocked:
        verdict = (ObjectState.BLOCKED, plan.vf_blocked[vf.index])
    elif vf.index in plan.vf_waiting:
        verdict = (ObjectState.PENDING, plan.vf_waiting[vf.index])
    elif plan.blocked is not None:
        verdict = (ObjectState.BLOCKED, plan.blocked)
    elif plan.waiting is not None:
        verdict = (ObjectState.PENDING, plan.waiting)
    elif numvfs.state is not ObjectState.CONVERGED:
        # VF settings are planned only once the declared count exists.
        verdict = (numvfs.state, numvfs.reason)
    else:
        verdict = (ObjectState.PENDING, DIFFERS)
    return AttrStatus(name, want, seen, verdict[0], verdict[1])
