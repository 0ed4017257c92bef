"""How a status detail says how an object, a VF or an attribute stands: a ``Verdict``
(a state and its reason), the worst of several, and the verdict of an object whose
actions are all about it (an rxe link, the peer-memory module).

Shared by the SR-IOV, rxe and peer-memory details so each ranks states the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rdmad.model import Action, Blocked, ObjectState, Waiting

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
CONVERGED: Verdict = (ObjectState.CONVERGED, "")


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst state among ``verdicts`` with the reason of the first that has it."""
    best: Verdict = CONVERGED
    rank = 0
    for verdict in verdicts:
        # Converged is the common case; skip the rank lookup (enum hashing is not free).
        if verdict[0] is not ObjectState.CONVERGED and _RANK[verdict[0]] > rank:
            best, rank = verdict, _RANK[verdict[0]]
    return best


def step_verdict(actions: Sequence[Action], same: bool) -> Verdict:
    """Blocked by the first ``Blocked``, else pending on the first step (a kernel change
    or a wait), else converged when the object is ``same`` as declared."""
    blocked = next((a.reason for a in actions if isinstance(a, Blocked)), None)
    if blocked is not None:
        return (ObjectState.BLOCKED, blocked)
    step = next((a.reason for a in actions if a.changes_kernel or isinstance(a, Waiting)), None)
    if step is not None:
        return (ObjectState.PENDING, step)
    return CONVERGED if same else (ObjectState.PENDING, DIFFERS)
