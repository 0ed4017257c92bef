"""A PF's eSwitch (``[[sriov]] eswitch``): mode, inline mode and encap mode, planned
before anything about its VFs.

Drivers reset the eSwitch to legacy at every boot and reload, and VF representors,
switchdev offloads and the port functions of VFs exist only in switchdev mode, so the
mode comes first: a pass that restores a PF sets the mode, then makes the VFs, then
their settings. A mode change while VFs exist re-creates their vports (mlx5 tears down
and re-creates each VF's eSwitch port; a VM's VF loses its traffic meanwhile), so it is
planned only while every VF and its representor (an OVS bridge port, an rxe link on it:
the representor netdevs are destroyed too) are known to be free, and re-checked right
before it is sent (``kernel.apply.recheck``). What the driver does not have is
``unsupported-by-driver``: a PF without an eSwitch at all, or an option it refused
(remembered in ``PlanState`` as for VF attributes, not retried until the config or the
driver changes).
"""

from __future__ import annotations

from rdmad.model import (
    PF_ATTR,
    Action,
    Blocked,
    EswitchSpec,
    PfObserved,
    PlanState,
    SetEswitch,
    Unsupported,
    UnsupportedKey,
)

OPTIONS = ("mode", "inline_mode", "encap_mode")  # the order devlink applies them in


def plan_eswitch(
    obj: str, want: EswitchSpec | None, pf: PfObserved, state: PlanState
) -> list[Action]:
    if want is None:
        return []
    seen = pf.eswitch
    if seen is None:
        return [Blocked(obj, f"{pf.pci}: the eSwitch is read over devlink, not read here")]
    if seen.unread is not None:
        return [
            Blocked(obj, f"{pf.pci}: the eSwitch could not be read ({seen.unread}); left as it is")
        ]
    if seen.mode is None:
        # "has no eSwitch" once: the absent words say why ("bnxt_en has none"), if known.
        why = f"{pf.pci} has no eSwitch" + (f": {seen.absent}" if seen.absent else "")
        return [Unsupported(obj, why, vf=PF_ATTR, attr="eswitch")]
    changes: list[tuple[str, str | None, str]] = []
    notes: list[Action] = []
    refused = {k: k for k in state.unsupported if k.pci == pf.pci and k.vf == PF_ATTR}
    for option in OPTIONS:
        new = getattr(want, option)
        old = getattr(seen, option)
        if new is None or new == old:
            continue
        key = UnsupportedKey(pf.pci, pf.driver or "", PF_ATTR, f"eswitch.{option}", new)
        if key in refused:
            said = refused[key].error or "refused"
            notes.append(
                Unsupported(
                    obj,
                    f"eswitch {option} = {new}: not supported by {pf.driver or 'the PF driver'} "
                    f"({said}); not retried until the config or the driver changes",
                    vf=PF_ATTR,
                    attr=f"eswitch.{option}",
                )
            )
            continue
        changes.append((option, old, new))
    if not changes:
        return notes
    if any(option == "mode" for option, _, _ in changes) and pf.numvfs > 0:
        held = _vfs_not_free(obj, pf)
        if held is not None:
            return [*notes, held]
    said = ", ".join(f"{o} {old or 'unset'} -> {new}" for o, old, new in changes)
    why = f"eswitch {said}" + (" (before the VFs)" if pf.numvfs == 0 else "")
    return [*notes, SetEswitch(obj, why, pci=pf.pci, changes=tuple(changes), numvfs=pf.numvfs)]


def _vfs_not_free(obj: str, pf: PfObserved) -> Blocked | None:
    """Why the mode may not change under the PF's VFs now; None when all are free."""
    busy = [v for v in pf.vfs if v.vport_busy]
    if busy:
        held = "; ".join(f"VF {v.index} ({v.pci}): {v.vport_holders()}" for v in busy)
        return Blocked(
            obj,
            f"the eSwitch mode change would re-create the vports of VFs in use: {held}",
            vfs=tuple(v.index for v in busy),
        )
    if len(pf.vfs) < pf.numvfs:
        return Blocked(
            obj,
            f"the eSwitch mode change: only {len(pf.vfs)} of {pf.numvfs} VFs are visible, "
            "so whether the others are in use is unknown",
        )
    return None
