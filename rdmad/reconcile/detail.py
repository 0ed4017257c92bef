"""Status detail per object, per VF and per attribute (docs/API.md ``/v1/status``):
what is declared, what the kernel shows, and what the plan says about each.

Pure: no I/O, no clock. It decides nothing itself: the plan already did. It only points
each action at the attributes and VFs it is about, and compares declared with observed
values through the planner's own helpers, so status and plan never disagree on what
"converged" means. ``Describer`` remembers its last answer (no globals, no clock), so a
node at rest costs a comparison per pass rather than a new detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdmad.model import (
    Action,
    AttrStatus,
    BindVfDriver,
    Blocked,
    Degraded,
    Desired,
    InUseDrift,
    NetdevObserved,
    Note,
    NotServing,
    ObjectDetail,
    ObjectState,
    Observed,
    PfObserved,
    RxeSpec,
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
from rdmad.peermem.findings import dmabuf_finding, preflight
from rdmad.peermem.names import modprobe_name
from rdmad.reconcile.peermem import OBJ as PEERMEM_OBJ
from rdmad.reconcile.peermem import declared as peermem_declared
from rdmad.reconcile.rxe import find_netdev
from rdmad.reconcile.sriov import (
    bound_as_declared,
    find_pf,
    ib_wanted,
    netlink_matches,
    netlink_wanted,
)

# How bad a state is, to pick the one a VF shows: the worst of its parts.
_RANK = {
    ObjectState.CONVERGED: 0,
    ObjectState.UNSUPPORTED: 1,
    ObjectState.DRIFT_IN_USE: 2,
    ObjectState.PENDING: 3,
    ObjectState.BLOCKED: 4,
    ObjectState.DEGRADED: 5,
}

NOT_PRESENT = "not present"
DIFFERS = "differs from the declaration"

Verdict = tuple[ObjectState, str]
_CONVERGED: Verdict = (ObjectState.CONVERGED, "")


def describe(
    desired: Desired, observed: Observed, actions: Sequence[Action]
) -> dict[str, ObjectDetail]:
    """Detail of every declared object and of every other object the plan names (e.g. an
    rxe link rdmad created that is no longer declared), keyed by object name."""
    mine: dict[str, list[Action]] = {}
    for action in actions:
        mine.setdefault(action.obj, []).append(action)
    out: dict[str, ObjectDetail] = {}
    for spec in desired.sriov:
        out[spec.obj] = _sriov(spec, observed, mine.get(spec.obj, ()))
    for rxe in desired.rxe:
        out[rxe.obj] = _rxe(rxe, observed, mine.get(rxe.obj, ()))
    if PEERMEM_OBJ in mine or PEERMEM_OBJ in peermem_declared(desired.peermem):
        out[PEERMEM_OBJ] = _peermem(desired, observed, mine.get(PEERMEM_OBJ, ()))
    for obj, acts in mine.items():
        if obj not in out:
            out[obj] = _undeclared(obj, observed, acts)
    return out


class Describer:
    """``describe`` that answers again from its last result while nothing it reads has
    changed: a node at rest is re-observed on every drift tick and unrelated event, and
    comparing two observations costs a fraction of describing one (bench/bench_detail.py).
    """

    def __init__(self) -> None:
        self._last: tuple[Desired, Observed, list[Action], dict[str, ObjectDetail]] | None = None

    def __call__(
        self, desired: Desired, observed: Observed, actions: Sequence[Action]
    ) -> dict[str, ObjectDetail]:
        last = self._last
        # The config in force is replaced, never changed in place: identity suffices.
        if (
            last is not None
            and last[0] is desired
            and last[2] == list(actions)
            and last[1] == observed
        ):
            return last[3]
        details = describe(desired, observed, actions)
        self._last = (desired, observed, list(actions), details)
        return details


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst state among ``verdicts`` with the reason of the first that has it."""
    best: Verdict = _CONVERGED
    rank = 0
    for verdict in verdicts:
        # Converged is the common case; skip the rank lookup (enum hashing is not free).
        if verdict[0] is not ObjectState.CONVERGED and _RANK[verdict[0]] > rank:
            best, rank = verdict, _RANK[verdict[0]]
    return best


# --- SR-IOV ------------------------------------------------------------------------------


@dataclass(slots=True)
class _SriovPlan:
    """One SR-IOV object's actions, indexed by what they are about."""

    changes: dict[tuple[int, str], str] = field(default_factory=dict)  # (vf, attr) -> reason
    binds: dict[str, str] = field(default_factory=dict)  # VF PCI address -> reason
    notes: dict[tuple[int, str], Verdict] = field(default_factory=dict)  # (vf, attr)
    vf_blocked: dict[int, str] = field(default_factory=dict)
    vf_waiting: dict[int, str] = field(default_factory=dict)
    blocked: str | None = None  # about the object, not one VF
    waiting: str | None = None
    any_blocked: str | None = None  # the first Blocked, whatever it is about
    any_waiting: str | None = None
    count_step: str | None = None  # SetNumVfs / SetLinkUp

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
        return p


def _sriov(spec: SriovSpec, observed: Observed, actions: Iterable[Action]) -> ObjectDetail:
    found = find_pf(spec.pf, observed)
    pf = found if isinstance(found, PfObserved) else None
    plan = _SriovPlan.read(actions)
    numvfs = _numvfs(spec, pf, plan)
    present = {v.index: v for v in pf.vfs} if pf is not None else {}
    declared = {v.index: v for v in spec.vf}
    vfs = tuple(
        _vf(i, declared.get(i), present.get(i), plan, numvfs)
        for i in sorted(declared.keys() | present.keys())
    )
    return ObjectDetail(
        kind="sriov",
        desired={
            "pf": spec.pf.key(),
            "numvfs": spec.numvfs,
            "driver_guard": spec.driver_guard,
            "in_use_drift": spec.in_use_drift,
        },
        observed={}
        if pf is None
        else {
            "pci": pf.pci,
            "netdev": pf.netdev,
            "driver": pf.driver,
            "numvfs": pf.numvfs,
            "totalvfs": pf.totalvfs,
            "up": pf.operstate_up,
            "guard": guard_state(spec, pf, observed),
        },
        attributes=(numvfs,),
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


def _numvfs(spec: SriovSpec, pf: PfObserved | None, plan: _SriovPlan) -> AttrStatus:
    """The VF count. When it differs, the planner plans the count (or says why it cannot)
    and the settings of the VFs it creates, so every action of the object is about it."""
    if pf is not None and pf.numvfs == spec.numvfs:
        verdict = _CONVERGED
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


# --- rxe ---------------------------------------------------------------------------------


def _rxe(spec: RxeSpec, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    link = observed.rdma_link(spec.name)
    target = find_netdev(spec.netdev, observed)
    want = target.name if isinstance(target, NetdevObserved) else spec.netdev.describe()
    seen = link.netdev if link is not None else None
    same = link is not None and link.is_rxe and seen == want
    unserving = next((a for a in actions if isinstance(a, NotServing)), None)
    others = [a for a in actions if not isinstance(a, NotServing)]
    state, reason = _rxe_verdict(others, same=same)
    attributes = [AttrStatus("netdev", want, seen, state, reason)]
    if same:
        # Present as declared: can its consumers use it (port ACTIVE, a GID of an address)?
        attributes.append(
            AttrStatus("serving", True, unserving is None, *_serving_verdict(unserving))
        )
    return ObjectDetail(
        kind="rxe",
        desired={"name": spec.name, "netdev": spec.netdev.describe()},
        observed=_link(observed, spec.name),
        attributes=tuple(attributes),
    )


def _serving_verdict(unserving: NotServing | None) -> Verdict:
    return _CONVERGED if unserving is None else (ObjectState.PENDING, unserving.reason)


def _rxe_verdict(actions: Sequence[Action], same: bool) -> Verdict:
    blocked = next((a.reason for a in actions if isinstance(a, Blocked)), None)
    if blocked is not None:
        return (ObjectState.BLOCKED, blocked)
    step = next((a.reason for a in actions if a.changes_kernel or isinstance(a, Waiting)), None)
    if step is not None:
        return (ObjectState.PENDING, step)
    return _CONVERGED if same else (ObjectState.PENDING, DIFFERS)


def _link(observed: Observed, name: str) -> dict[str, Any]:
    link = observed.rdma_link(name)
    if link is None:
        return {}
    return {
        "name": link.name,
        "netdev": link.netdev,
        "usage": link.usage.state.value,
        "port_state": link.port_state,
        "gids": list(link.gids) if link.gids is not None else None,
    }


def _peermem(desired: Desired, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    """The peer-memory module: which one, whether loaded, and the findings about it."""
    facts = observed.modules.peermem
    loaded = facts.loaded_module()
    installed = facts.module()
    module = loaded or (installed.name if installed is not None else None)
    findings = [*preflight(facts)] if loaded is None else []
    dmabuf = dmabuf_finding(facts)
    if dmabuf is not None:
        findings.append(dmabuf)
    degraded = next((a.reason for a in actions if isinstance(a, Degraded)), None)
    if degraded is not None:
        verdict: Verdict = (ObjectState.DEGRADED, degraded)
    else:
        verdict = _rxe_verdict(actions, same=loaded is not None)
        if verdict[0] is ObjectState.PENDING and verdict[1] == DIFFERS:
            note = next((a.reason for a in actions if isinstance(a, Note)), "")
            verdict = (ObjectState.CONVERGED, note)
    state, reason = verdict
    return ObjectDetail(
        kind="peermem",
        desired={"mode": desired.peermem.mode},
        observed={
            "module": modprobe_name(module) if module else None,
            "loaded": loaded is not None,
            "gpu_driver": "nvidia" in facts.loaded,
            "rdma_core": "ib_core" in facts.loaded,
            "findings": [f.to_json() for f in findings],
        },
        attributes=(AttrStatus("loaded", True, loaded is not None, state, reason),),
    )


def _undeclared(obj: str, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    """An object only the plan names: today an rxe link rdmad created that is no longer
    declared (to be deleted, or kept because it is in use)."""
    kind, _, name = obj.partition(" ")
    if kind != "rxe":
        return ObjectDetail(kind=kind)
    seen = _link(observed, name)
    state, reason = _rxe_verdict(actions, same=not seen)
    netdev = AttrStatus("netdev", None, seen.get("netdev"), state, reason)
    return ObjectDetail(kind="rxe", observed=seen, attributes=(netdev,))
