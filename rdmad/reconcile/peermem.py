"""GPUDirect peer-memory policy: the plan's side of ``rdmad.peermem.choice.decide``.

``decide`` says what the node needs; this turns it into the plan's words. Loading is
the only kernel change, and it happens in one place (``load_peermem``) so that a
later rule (e.g. no module loads while the RDMA stack is paused) gates it there.
peermem is never unloaded: it pins ib_uverbs, but taking it away under a running
job breaks the job; an RDMA stack restart removes it and the next pass loads it again.
"""

from __future__ import annotations

from rdmad.model import (
    Action,
    Blocked,
    Degraded,
    LoadModule,
    Note,
    Observed,
    PeermemSpec,
    PlanState,
)
from rdmad.peermem.choice import Decision, decide
from rdmad.peermem.names import GPU_DRIVER, RDMA_CORE, modprobe_name

OBJ = "peermem"


def plan_peermem(spec: PeermemSpec, observed: Observed, state: PlanState) -> list[Action]:
    decision = decide(spec.mode, observed.modules.peermem, state.peermem_held)
    info = "; ".join(f.describe() for f in decision.findings if f.severity == "info")
    required = spec.mode == "require"
    verdict = decision.verdict
    if verdict in ("off", "not-needed"):
        return []  # auto without a GPU driver or an RDMA core: nothing to say
    if verdict == "loaded":
        return [Note(OBJ, _join(decision.reason, info))]
    if verdict == "waiting":
        # Only "require" waits: auto does not need peermem until both are there.
        return [Degraded(OBJ, f"required, but {decision.reason}")]
    if verdict == "load":
        return load_peermem(decision)
    # cannot-load
    if required:
        return [Degraded(OBJ, f"required, but {decision.reason}")]
    if info:
        # GPUDirect RDMA works through DMA-BUF here: no peermem is no fault.
        return [Note(OBJ, _join(decision.reason, info))]
    return [Blocked(OBJ, decision.reason)]


def load_peermem(decision: Decision) -> list[Action]:
    """The one place a peer-memory module load is planned."""
    assert decision.module is not None
    return [
        LoadModule(
            OBJ,
            decision.reason,
            module=modprobe_name(decision.module),
            requires=(GPU_DRIVER, RDMA_CORE),
        )
    ]


def declared(spec: PeermemSpec) -> list[str]:
    """Objects status always lists: peermem when it is required (auto shows it when it
    matters: a GPU driver and an RDMA core are loaded)."""
    return [OBJ] if spec.mode == "require" else []


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
