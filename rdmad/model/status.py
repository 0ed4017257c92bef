"""Per-object status derived from a plan: converged when the plan has nothing for it;
and the shapes of per-VF, per-attribute detail (filled by ``rdmad.reconcile.detail``)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from rdmad.model.actions import Action, Blocked, Degraded, InUseDrift, Note, Unsupported

# --- status ------------------------------------------------------------------------------


class ObjectState(enum.Enum):
    CONVERGED = "converged"
    PENDING = "pending"  # actions to apply, or waiting for the kernel
    BLOCKED = "blocked"  # would hurt something in use, or impossible as declared
    DEGRADED = "degraded"  # applying failed; retried with backoff
    UNSUPPORTED = "unsupported-by-driver"  # all else converged; the driver refuses an attribute
    DRIFT_IN_USE = "drift-on-in-use-vf"  # all else converged; a VF in use differs, left alone


class ObjectStatus(msgspec.Struct, frozen=True):
    obj: str
    state: ObjectState
    message: str = ""


# --- converged: the one definition ------------------------------------------------------
#
# rdmad-ctl's headline and exit code, /v1/status's ``converged`` and ``verdict``, sd_notify's
# StatusText, the ``rdmad_converged`` gauge and the RdmadNotConverged alert (on that gauge)
# all come from ``node_verdict``; nothing else decides what "converged" means.

# An object counts as converged when it is as declared as far as its driver allows: an
# attribute the driver refuses (``unsupported-by-driver``) cannot be had by any means but
# a config change. A VF in use that differs from its declaration (``drift-on-in-use-vf``)
# is not as declared: rdmad leaves it alone, but the node is not what the config says
# until someone frees the VF or opts in (``in_use_drift = "apply"``), so it is not.
CONVERGED_STATES = frozenset({ObjectState.CONVERGED, ObjectState.UNSUPPORTED})

# Which object's reason a one-line summary names: the most urgent first.
WORST_FIRST = (
    ObjectState.DEGRADED,
    ObjectState.BLOCKED,
    ObjectState.PENDING,
    ObjectState.DRIFT_IN_USE,
    ObjectState.UNSUPPORTED,
)


class NodeState(enum.Enum):
    STARTING = "starting"  # no pass has finished
    CONVERGED = "converged"
    NOT_CONVERGED = "not-converged"  # an object not converged, or the config invalid
    DEGRADED = "degraded"  # passes fail (observe or plan raised), or applying fails


class Verdict(msgspec.Struct, frozen=True):
    state: NodeState
    reason: str = ""  # why not converged, in words ("" when converged)

    @property
    def converged(self) -> bool:
        return self.state is NodeState.CONVERGED

    def to_json(self) -> dict[str, str]:
        return {"state": self.state.value, "reason": self.reason}


def node_verdict(
    objects: Sequence[ObjectStatus],
    *,
    passes: int,
    config_errors: int = 0,
    pass_error: str | None = None,
) -> Verdict:
    """The node's verdict from its objects and how its passes went.

    Starting until a pass finished; degraded while passes fail (``pass_error``: the
    objects are then those of the last pass that worked, and say nothing of now) or an
    object's applying fails; not converged while any object is outside
    ``CONVERGED_STATES`` or the config on disk is invalid; else converged.
    """
    if passes == 0:
        return Verdict(NodeState.STARTING, "the first reconcile pass has not finished")
    if pass_error is not None:
        return Verdict(NodeState.DEGRADED, f"passes fail: {pass_error}")
    worst = worst_object(objects)
    if worst is not None and worst.state is ObjectState.DEGRADED:
        return Verdict(NodeState.DEGRADED, f"{worst.obj}: {worst.message}")
    if worst is not None and worst.state not in CONVERGED_STATES:
        return Verdict(NodeState.NOT_CONVERGED, f"{worst.obj}: {worst.message}")
    if config_errors:
        return Verdict(NodeState.NOT_CONVERGED, f"config invalid ({config_errors} error(s))")
    return Verdict(NodeState.CONVERGED)


def worst_object(objects: Sequence[ObjectStatus]) -> ObjectStatus | None:
    """The object whose reason matters most (``WORST_FIRST``); None when all converged."""
    return next((o for state in WORST_FIRST for o in objects if o.state is state), None)


# --- detail: per attribute and per VF (the API's /v1/status, docs/API.md) ---------------


class AttrStatus(msgspec.Struct, frozen=True):
    """One declared attribute: what is declared, what the kernel shows, and why they differ.

    Values are JSON values (str, int, bool or None for unset / not reported).
    """

    name: str
    desired: Any
    observed: Any
    state: ObjectState
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "desired": self.desired,
            "observed": self.observed,
            "state": self.state.value,
            "reason": self.reason,
        }


class VfStatus(msgspec.Struct, frozen=True):
    """One VF of a PF: declared, present, or both."""

    vf: int
    pci: str | None
    netdev: str | None
    driver: str | None
    state: ObjectState
    reason: str = ""
    usage: str = "free"  # Use.value: free, in-use, unknown
    holders: tuple[str, ...] = ()
    attributes: tuple[AttrStatus, ...] = ()
    representor: str | None = None  # its representor netdev (the PF in switchdev mode)

    def to_json(self) -> dict[str, Any]:
        return {
            "vf": self.vf,
            "pci": self.pci,
            "netdev": self.netdev,
            "representor": self.representor,
            "driver": self.driver,
            "state": self.state.value,
            "reason": self.reason,
            "usage": self.usage,
            "holders": list(self.holders),
            "attributes": [a.to_json() for a in self.attributes],
        }


class ObjectDetail(msgspec.Struct, frozen=True):
    """What status shows of one object beyond its state: desired vs observed, per
    attribute and per VF. The mappings are read-only by convention (never mutated)."""

    kind: str  # "sriov" | "rxe"
    desired: Mapping[str, Any] = msgspec.field(default_factory=dict)
    observed: Mapping[str, Any] = msgspec.field(default_factory=dict)
    attributes: tuple[AttrStatus, ...] = ()
    vfs: tuple[VfStatus, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "desired": dict(self.desired),
            "observed": dict(self.observed),
            "attributes": [a.to_json() for a in self.attributes],
            "vfs": [v.to_json() for v in self.vfs],
        }


# Notes that leave an object otherwise converged, in the order they are reported.
_NOTE_STATES: tuple[tuple[type[Action], ObjectState], ...] = (
    (InUseDrift, ObjectState.DRIFT_IN_USE),
    (Unsupported, ObjectState.UNSUPPORTED),
)


def summarize(objects: list[str], actions: list[Action]) -> list[ObjectStatus]:
    """Per declared object: converged when the plan has nothing for it.

    Degraded (required, cannot be had now) beats blocked beats pending (actions or
    waiting) beats the notes that leave an object otherwise converged (drift on an
    in-use VF, an attribute the driver refuses); a plain ``Note`` is converged.
    """
    result = []
    for obj in objects:
        mine = [a for a in actions if a.obj == obj]
        if not mine:
            result.append(ObjectStatus(obj, ObjectState.CONVERGED))
            continue
        blocked = [a for a in mine if isinstance(a, Blocked)]
        degraded = [a for a in mine if isinstance(a, Degraded)]
        notes = {t: [a for a in mine if isinstance(a, t)] for t, _ in _NOTE_STATES}
        plain = [a for a in mine if isinstance(a, Note)]
        active = [
            a
            for a in mine
            if not isinstance(a, Blocked | Degraded | InUseDrift | Unsupported | Note)
        ]
        if degraded:
            result.append(ObjectStatus(obj, ObjectState.DEGRADED, degraded[0].reason))
        elif blocked:
            result.append(ObjectStatus(obj, ObjectState.BLOCKED, blocked[0].reason))
        elif active:
            result.append(ObjectStatus(obj, ObjectState.PENDING, active[0].reason))
        else:
            for kind, state in _NOTE_STATES:
                if notes[kind]:
                    msg = "; ".join(a.reason for a in notes[kind])
                    result.append(ObjectStatus(obj, state, msg))
                    break
            else:
                msg = "; ".join(a.reason for a in plain)
                result.append(ObjectStatus(obj, ObjectState.CONVERGED, msg))
    return result
