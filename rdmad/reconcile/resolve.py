"""From ``[[sriov]]`` declarations to what the planner acts on, on this node: which PF
each declaration means, each VF's settings, and each MAC as a literal. Pure: no I/O.

* **Which PF.** A literal ``pf`` names one PF (missing: the planner waits, as always).
  A ``select`` means every SR-IOV PF that matches each of its keys; each matched PF is
  its own object, named by its PCI address (``sriov pci=0000:3b:00.0``, the name a
  literal ``pf = { pci = ... }`` gives it, so status and history do not change when a
  node's file moves to selectors). A selector that matches no PF here is converged with
  a note saying so; but a PF with no driver that udev has not processed yet (at boot)
  and that a selector could match once it has one waits under that name.
* **One declaration per PF.** A literal ``pf`` wins over a selector for the PF it names
  (a node-specific drop-in overrides the fleet's file for one PF); the selector still
  applies to its other PFs. Two selectors that match one PF are refused on that PF,
  naming both: never merged. Two literals that reach one PF are refused as before
  (``plan_sriov``).
* **Each VF.** ``[[sriov.vf]]`` blocks apply in layers: ``index = "rest"`` to the VFs no
  range names, a range (``"0-7"``) to its VFs, a VF's own block (``index = 3``) last;
  each key set in a later layer overrides the earlier one's.
* **Each MAC.** A derived MAC (``rdmad.reconcile.macs``) becomes a literal; one that
  cannot be derived here (no permanent MAC, no machine-id) is blocked for that VF, and
  a derived MAC another VF of the node also gets is refused on both, naming them.
"""

from __future__ import annotations

import msgspec

from rdmad import pfselect
from rdmad.model import (
    Action,
    Blocked,
    Desired,
    NetdevRef,
    Note,
    Observed,
    PfObserved,
    PfRef,
    SriovSpec,
    VfSpec,
    Waiting,
)
from rdmad.model.desired import REST, MacDerive, PfSelect, VfBlock, vf_range
from rdmad.reconcile.macs import MACHINE_ID, derive_mac, usable_perm_mac

# VfBlock keys a layer carries to VfSpec (all but the index).
_VF_KEYS: tuple[str, ...] = tuple(
    f.name for f in msgspec.structs.fields(VfBlock) if f.name != "index"
)


class SriovTarget(msgspec.Struct, frozen=True):
    """One PF as the planner sees it: its object's name, the declaration, the literal
    reference that finds it, and its VFs with every value literal."""

    obj: str
    spec: SriovSpec
    ref: PfRef
    vfs: tuple[VfSpec, ...]
    select: PfSelect | None = None  # the selector that matched it, if one did
    notes: tuple[Action, ...] = ()  # VFs whose MAC could not be had
    derived: frozenset[int] = frozenset()  # the VFs whose MAC was derived


class SelectorOutcome(msgspec.Struct, frozen=True):
    """An object that is no target: a selector with no PF of its own here (a note), or
    a PF two selectors match (blocked)."""

    obj: str
    action: Action
    desired: dict[str, object] = msgspec.field(default_factory=dict)


class Resolution(msgspec.Struct, frozen=True):
    targets: tuple[SriovTarget, ...] = ()
    others: tuple[SelectorOutcome, ...] = ()

    def objects(self) -> list[str]:
        return [t.obj for t in self.targets] + [o.obj for o in self.others]


def find_pf(ref: NetdevRef, observed: Observed) -> PfObserved | str | None:
    """The PF a reference names; a string explains an ambiguous match (MACs can repeat:
    bonds copy them, some NICs share one across ports)."""
    hits = [
        pf
        for pf in observed.pfs
        if (ref.pci is not None and pf.pci == ref.pci)
        or (ref.name is not None and pf.netdev == ref.name)
        or (ref.mac is not None and ref.mac in (pf.perm_mac, pf.mac))
    ]
    if len(hits) > 1:
        pcis = ", ".join(pf.pci for pf in hits)
        return f"{ref.describe()} matches several PFs ({pcis}); name it by PCI address"
    return hits[0] if hits else None


def matches(select: PfSelect, pf: PfObserved) -> bool:
    """Each key given matches (any of its values): vendor and device IDs exactly, the
    driver, PCI address and netdev name as shell patterns. A PF that lacks what a key
    asks about (no driver bound, no netdev, not PCI) does not match it. The rule is
    ``rdmad.pfselect``'s, which rdmad-ctl doctor applies too."""
    return pfselect.matches(select.selector(), _candidate(pf))


def could_match(select: PfSelect, pf: PfObserved) -> bool:
    """Whether ``pf`` could match once it has what it lacks now (a driver, a netdev):
    ``rdmad.pfselect.could_match``."""
    return pfselect.could_match(select.selector(), _candidate(pf))


def _candidate(pf: PfObserved) -> pfselect.Candidate:
    return pfselect.Candidate(pf.pci, pf.vendor, pf.device, pf.driver, pf.netdev)


def resolve(desired: Desired, observed: Observed) -> Resolution:
    """Every ``[[sriov]]`` of ``desired`` on the node ``observed`` shows (module doc)."""
    literal: dict[str, SriovSpec] = {}  # PCI address -> the literal declaration naming it
    for spec in desired.sriov:
        if spec.pf is not None:
            pf = find_pf(spec.pf, observed)
            if isinstance(pf, PfObserved):
                literal.setdefault(pf.pci, spec)
    claims: dict[str, list[SriovSpec]] = {}
    for spec in desired.sriov:
        if spec.select is not None:
            for pf in observed.pfs:
                if pf.pci not in literal and matches(spec.select, pf):
                    claims.setdefault(pf.pci, []).append(spec)
    targets: list[SriovTarget] = []
    others: list[SelectorOutcome] = []
    for spec in desired.sriov:
        if spec.pf is not None:
            found = find_pf(spec.pf, observed)
            pf = found if isinstance(found, PfObserved) else None
            targets.append(_target(spec.obj, spec, spec.pf, pf, observed, None))
            continue
        select = spec.select
        assert select is not None
        mine = [pf for pf in observed.pfs if claims.get(pf.pci) == [spec]]
        for pf in mine:
            obj = f"sriov {PfRef(pci=pf.pci).key()}"
            targets.append(_target(obj, spec, PfRef(pci=pf.pci), pf, observed, select))
        for pf in observed.pfs:
            rivals = claims.get(pf.pci, [])
            if len(rivals) > 1 and rivals[0] is spec:
                others.append(_contested(pf, rivals))
        if not mine:
            others.append(_unmatched(spec, select, observed, literal, claims))
    others.extend(_awaited(desired, observed, literal, claims))
    return Resolution(_unique_macs(targets), tuple(others))


def _target(
    obj: str,
    spec: SriovSpec,
    ref: PfRef,
    pf: PfObserved | None,
    observed: Observed,
    select: PfSelect | None,
) -> SriovTarget:
    vfs, notes, derived = _vfs(obj, spec, pf, observed)
    return SriovTarget(obj, spec, ref, vfs, select, tuple(notes), derived)


def _contested(pf: PfObserved, rivals: list[SriovSpec]) -> SelectorOutcome:
    obj = f"sriov {PfRef(pci=pf.pci).key()}"
    names = " and ".join(s.select.key() for s in rivals if s.select is not None)
    why = (
        f"{pf.pci} is matched by {len(rivals)} selectors ({names}); a PF follows one "
        f"declaration, so none is applied: narrow the selectors, or name the PF with "
        f'pf = {{ pci = "{pf.pci}" }} (a literal pf wins over selectors)'
    )
    return SelectorOutcome(obj, Blocked(obj, why), {"pf": f"pci={pf.pci}", "select": names})


def _unmatched(
    spec: SriovSpec,
    select: PfSelect,
    observed: Observed,
    literal: dict[str, SriovSpec],
    claims: dict[str, list[SriovSpec]],
) -> SelectorOutcome:
    """A selector that has no PF of its own here: why, as a note (converged)."""
    hits = [pf.pci for pf in observed.pfs if matches(select, pf)]
    taken = [p for p in hits if p in literal]
    contested = [p for p in hits if len(claims.get(p, [])) > 1]
    free = [_candidate(pf) for pf in observed.pfs if pf.pci not in literal]
    driverless = pfselect.unbound(select.selector(), free)
    # Those udev has not processed yet wait as objects of their own (``_awaited``); the
    # others (a driver unloaded, or none loaded for them) are nothing to wait for, but
    # what status says must name them.
    later = [pf.pci for pf in _unprocessed(observed, literal, claims) if pf.pci in driverless]
    unbound = [pci for pci in driverless if pci not in later]
    if not hits and later:
        why = (
            f"no PF matches {select.describe()} yet; {', '.join(later)} may once its "
            "driver is bound (each waits as an object of its own)"
        )
    elif not hits and unbound:
        why = (
            f"no PF matches {select.describe()} on this node now; {pfselect.unbound_words(unbound)}"
        )
    elif not hits:
        why = f"no PF matches {select.describe()} on this node: nothing to do"
    else:
        parts = []
        if taken:
            objs = ", ".join(f"{p} ({literal[p].obj})" for p in taken)
            parts.append(f"declared by a literal pf, which wins over a selector: {objs}")
        if contested:
            rivals = ", ".join(contested)
            parts.append(f"also matched by another selector (blocked there): {rivals}")
        why = f"the PFs {select.describe()} matches are {'; '.join(parts)}: nothing else to do"
    desired = {"select": select.key(), "numvfs": spec.numvfs, "matches": hits}
    return SelectorOutcome(spec.obj, Note(spec.obj, why), desired)


def _awaited(
    desired: Desired,
    observed: Observed,
    literal: dict[str, SriovSpec],
    claims: dict[str, list[SriovSpec]],
) -> list[SelectorOutcome]:
    """Each PF with no driver bound that udev has not processed yet (at boot, before
    coldplug reached it: its driver may still be loaded) and that a selector could match
    once a driver is bound: it waits, under the name it gets when it matches, so that
    the node does not read converged before then. Once udev has processed it, a PF
    with no driver matches no ``driver`` or ``name`` key, as documented."""
    out = []
    for pf in _unprocessed(observed, literal, claims):
        could = [s.select for s in desired.sriov if s.select and could_match(s.select, pf)]
        if not could:
            continue
        obj = f"sriov {PfRef(pci=pf.pci).key()}"
        why = (
            f"{pfselect.pending_words([pf.pci], pf.udev_unread)}: "
            f"{' or '.join(select.describe() for select in could)} may match it once one is"
        )
        names = " and ".join(select.key() for select in could)
        out.append(
            SelectorOutcome(obj, Waiting(obj, why), {"pf": f"pci={pf.pci}", "select": names})
        )
    return out


def _unprocessed(
    observed: Observed, literal: dict[str, SriovSpec], claims: dict[str, list[SriovSpec]]
) -> list[PfObserved]:
    """The PFs with no driver bound that udev has not processed yet, and that neither a
    literal ``pf`` nor a selector has now."""
    return [
        pf
        for pf in observed.pfs
        if pf.driver is None and pf.udev_pending and pf.pci not in literal and pf.pci not in claims
    ]


# --- VFs ---------------------------------------------------------------------------------


def _vfs(
    obj: str, spec: SriovSpec, pf: PfObserved | None, observed: Observed
) -> tuple[tuple[VfSpec, ...], list[Action], frozenset[int]]:
    """Each VF a block reaches, its layers applied in order, its MAC made literal."""
    singles = {b.index: b for b in spec.vf if isinstance(b.index, int)}
    ranges = [(span, b) for b in spec.vf if (span := vf_range(b.index)) is not None]
    rest = next((b for b in spec.vf if b.index == REST), None)
    covered = {i for span, _ in ranges for i in span}
    out: list[VfSpec] = []
    notes: list[Action] = []
    derived_here: set[int] = set()
    for i in range(spec.numvfs):
        layers = [b for span, b in ranges if i in span]
        if rest is not None and i not in covered:
            layers.insert(0, rest)
        if i in singles:
            layers.append(singles[i])
        if not layers:
            continue
        values: dict[str, object] = {}
        for block in layers:
            values.update({k: v for k in _VF_KEYS if (v := getattr(block, k)) is not None})
        mac = values.get("mac")
        if isinstance(mac, MacDerive):
            derived = _derive(obj, mac, i, pf, observed)
            if isinstance(derived, Blocked):
                notes.append(derived)
                del values["mac"]
            elif derived is None:
                del values["mac"]  # the PF is not here: the planner waits for it
            else:
                values["mac"] = derived
                derived_here.add(i)
        try:
            out.append(VfSpec(index=i, **values))  # type: ignore[arg-type]
        except ValueError as exc:  # a VF's block and its range's together
            notes.append(Blocked(obj, f"VF {i}: {exc} (its own block and its range's)", (i,)))
    return tuple(out), notes, frozenset(derived_here)


def _derive(
    obj: str, how: MacDerive, vf: int, pf: PfObserved | None, observed: Observed
) -> str | Blocked | None:
    if pf is None:
        return None
    if how.derive == MACHINE_ID:
        if observed.machine_id is None:
            return Blocked(
                obj,
                f"VF {vf}: its MAC is derived from /etc/machine-id, which this node lacks "
                "or rdmad cannot see (a container needs the host's mounted)",
                (vf,),
            )
        return derive_mac(how.derive, vf=vf, machine_id=observed.machine_id, pf=pf.pci)
    perm = usable_perm_mac(pf.perm_mac)
    if perm is None:
        return Blocked(
            obj,
            f"VF {vf}: its MAC is derived from the PF's permanent MAC, which {pf.pci} "
            f'does not report (driver {pf.driver}); derive = "machine-id" needs none',
            (vf,),
        )
    return derive_mac(how.derive, vf=vf, pf_mac=perm)


def _unique_macs(targets: list[SriovTarget]) -> tuple[SriovTarget, ...]:
    """A derived MAC must be the node's only VF with it: one that another VF also gets
    (two PFs that report one permanent MAC, a literal equal to a derived one) is
    refused on both VFs, naming them. Literal MACs repeated across PFs stay allowed (a
    VM's failover bond gives one MAC to a VF of each port)."""
    owners: dict[str, list[tuple[int, int]]] = {}  # MAC -> (target, VF index)
    for n, t in enumerate(targets):
        for v in t.vfs:
            if v.mac is not None:
                owners.setdefault(v.mac, []).append((n, v.index))
    drop: dict[int, dict[int, str]] = {}  # target -> VF -> why
    for mac, who in owners.items():
        if len(who) < 2 or not any(i in targets[n].derived for n, i in who):
            continue
        named = " and ".join(f"VF {i} of {_pf_name(targets[n])}" for n, i in who)
        why = f"{named} would all get MAC {mac}: a derived MAC is unique on the node"
        if len({targets[n].obj for n, _ in who}) > 1:
            why += ' (PFs that report one permanent MAC: derive = "machine-id" tells them apart)'
        for n, i in who:
            drop.setdefault(n, {})[i] = why
    out = []
    for n, t in enumerate(targets):
        if n not in drop:
            out.append(t)
            continue
        vfs = tuple(
            msgspec.structs.replace(v, mac=None) if v.index in drop[n] else v for v in t.vfs
        )
        refused = tuple(Blocked(t.obj, f"VF {i}: {why}", (i,)) for i, why in drop[n].items())
        out.append(msgspec.structs.replace(t, vfs=vfs, notes=t.notes + refused))
    return tuple(out)


def _pf_name(target: SriovTarget) -> str:
    return target.ref.pci or target.ref.describe()
