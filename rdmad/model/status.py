"""Per-object status derived from a plan: converged when the plan has nothing for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rdmad.model.actions import Action, Blocked, InUseDrift, Unsupported

# --- status ------------------------------------------------------------------------------


class ObjectState(enum.Enum):
    CONVERGED = "converged"
    PENDING = "pending"  # actions to apply, or waiting for the kernel
    BLOCKED = "blocked"  # would hurt something in use, or impossible as declared
    DEGRADED = "degraded"  # applying failed; retried with backoff
    UNSUPPORTED = "unsupported-by-driver"  # all else converged; the driver refuses an attribute
    DRIFT_IN_USE = "drift-on-in-use-vf"  # all else converged; a VF in use differs, left alone


@dataclass(frozen=True, slots=True)
class ObjectStatus:
    obj: str
    state: ObjectState
    message: str = ""


# Notes that leave an object otherwise converged, in the order they are reported.
_NOTE_STATES: tuple[tuple[type[Action], ObjectState], ...] = (
    (InUseDrift, ObjectState.DRIFT_IN_USE),
    (Unsupported, ObjectState.UNSUPPORTED),
)


def summarize(objects: list[str], actions: list[Action]) -> list[ObjectStatus]:
    """Per declared object: converged when the plan has nothing for it.

    Blocked beats pending (actions or waiting) beats the notes that leave an object
    otherwise converged (drift on an in-use VF, an attribute the driver refuses).
    """
    result = []
    for obj in objects:
        mine = [a for a in actions if a.obj == obj]
        if not mine:
            result.append(ObjectStatus(obj, ObjectState.CONVERGED))
            continue
        blocked = [a for a in mine if isinstance(a, Blocked)]
        notes = {t: [a for a in mine if isinstance(a, t)] for t, _ in _NOTE_STATES}
        active = [a for a in mine if not isinstance(a, Blocked | InUseDrift | Unsupported)]
        if blocked:
            result.append(ObjectStatus(obj, ObjectState.BLOCKED, blocked[0].reason))
        elif active:
            result.append(ObjectStatus(obj, ObjectState.PENDING, active[0].reason))
        else:
            for kind, state in _NOTE_STATES:
                if notes[kind]:
                    msg = "; ".join(a.reason for a in notes[kind])
                    result.append(ObjectStatus(obj, state, msg))
                    break
    return result
