"""The decision: whether to load a peer-memory module now, which one, and why not.

``decide`` puts the mode (``[peermem] mode``), the facts and a remembered lasting
failure (``Held``) together; the planner (``rdmad.reconcile.peermem``) turns its
``Decision`` into actions and ``rdmad-ctl doctor`` into a check, so both say the same
thing about the same node. Never unloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from rdmad.peermem.facts import PeermemFacts
from rdmad.peermem.findings import Finding, dmabuf_finding, preflight
from rdmad.peermem.names import CANDIDATES, GPU_DRIVER, RDMA_CORE, modprobe_name

Mode = Literal["auto", "require", "off"]
Verdict = Literal["off", "not-needed", "loaded", "load", "cannot-load", "waiting"]


@dataclass(frozen=True, slots=True)
class Held:
    """A lasting failure the daemon remembers: not retried while the facts are the same."""

    module: str
    finding: Finding
    fingerprint: tuple[object, ...] = field(compare=False, default=())


class Decision(NamedTuple):
    verdict: Verdict
    module: str | None  # the canonical module that applies (to load, or loaded)
    reason: str
    findings: tuple[Finding, ...] = ()

    @property
    def blocking(self) -> Finding | None:
        return next((f for f in self.findings if f.severity == "blocking"), None)


def needs_all_facts(mode: Mode, loaded: frozenset[str]) -> bool:
    """Whether ``decide`` (and the status detail beside it) can turn on the costly facts
    (the module tree, the module files, /proc/kallsyms: ``gather(full=True)``), given
    the modules loaded now. off decides nothing; without the GPU driver peermem is not
    needed, whatever is installed; auto stays silent until the RDMA core is there too,
    while require reports what is missing (its detail names the module and its
    findings) as soon as the GPU driver is.
    """
    if mode == "off" or GPU_DRIVER not in loaded:
        return False
    return mode == "require" or RDMA_CORE in loaded


def decide(mode: Mode, facts: PeermemFacts, held: Held | None = None) -> Decision:
    """Whether to load peermem now, given the mode, the facts and a remembered failure.

    auto: load only when both the GPU driver and the RDMA core are present. require:
    the same, and anything short of loaded is reported (degraded by the caller). off:
    nothing. Never unload.
    """
    if mode == "off":
        return Decision("off", None, "[peermem] mode = off")
    loaded = facts.loaded_module()
    info = tuple(f for f in (dmabuf_finding(facts),) if f is not None)
    if loaded is not None:
        return Decision("loaded", loaded, f"{modprobe_name(loaded)} is loaded", info)
    missing = facts.prerequisites()
    if missing:
        words = " and ".join(
            "the NVIDIA GPU driver (nvidia)" if m == GPU_DRIVER else "the RDMA core (ib_core)"
            for m in missing
        )
        return Decision(
            "not-needed" if mode == "auto" else "waiting", None, f"{words} not loaded", info
        )
    if held is not None and held.fingerprint == facts.fingerprint():
        return Decision(
            "cannot-load",
            held.module,
            f"{modprobe_name(held.module)} cannot be loaded: {held.finding.describe()}",
            (held.finding, *info),
        )
    found = preflight(facts)
    module = facts.module()
    if found:
        name = module.name if module is not None else CANDIDATES[0]
        return Decision(
            "cannot-load",
            name,
            f"{modprobe_name(name)} cannot be loaded: {found[0].describe()}",
            (*found, *info),
        )
    if module is None:
        # Not probed (a cheap observation): the planner is never handed that with nvidia
        # and ib_core loaded, but say so rather than guess.
        return Decision("waiting", None, "the module tree was not read", info)
    return Decision(
        "load",
        module.name,
        f"{GPU_DRIVER} and {RDMA_CORE} are loaded and {modprobe_name(module.name)} is not",
        info,
    )
