"""The status detail of the peer-memory module: which one, whether it is loaded, and
the findings about it (the same ``rdmad.peermem`` findings the plan and the doctor use).
"""

from __future__ import annotations

from collections.abc import Sequence

from rdmad.model import (
    Action,
    AttrStatus,
    Degraded,
    Desired,
    Note,
    ObjectDetail,
    ObjectState,
    Observed,
)
from rdmad.peermem.findings import dmabuf_finding, preflight
from rdmad.peermem.names import modprobe_name
from rdmad.reconcile.detail.verdicts import DIFFERS, Verdict, step_verdict


def peermem_detail(desired: Desired, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
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
        verdict = step_verdict(actions, same=loaded is not None)
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
