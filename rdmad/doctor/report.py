"""The doctor's results: one ``Check`` per question, a table for people, JSON for tools,
and the exit code (1 when something blocks RDMA, else 0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rdmad.text import safe

Status = Literal["ok", "info", "warn", "fail", "unknown"]
_MARK = {"ok": "ok", "info": "info", "warn": "WARN", "fail": "FAIL", "unknown": "?"}


@dataclass(frozen=True, slots=True)
class Check:
    """One answer. ``fail`` blocks RDMA (or GPUDirect where it is needed); ``unknown``
    could not be checked (``evidence`` says why)."""

    id: str  # e.g. "peermem", "iommu", "rdma-devices"
    status: Status
    summary: str
    evidence: tuple[str, ...] = ()
    suggestion: str = ""
    findings: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.id,
            "status": self.status,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "suggestion": self.suggestion,
            "findings": list(self.findings),
        }


@dataclass(frozen=True, slots=True)
class Report:
    checks: tuple[Check, ...]
    unread: tuple[str, ...] = ()  # what could not be read, with why
    notes: tuple[str, ...] = field(default=())

    @property
    def blocking(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def exit_code(self) -> int:
        return 1 if self.blocking else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "blocking": self.blocking,
            "checks": [c.to_json() for c in self.checks],
            "unread": list(self.unread),
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        width = max((len(c.id) for c in self.checks), default=5)
        out = [f"note: {n}" for n in self.notes]
        out.append(f"{'CHECK':<{width}}  {'STATUS':<6}  SUMMARY")
        for c in self.checks:
            out.append(f"{c.id:<{width}}  {_MARK[c.status]:<6}  {c.summary}")
        details = [c for c in self.checks if c.status != "ok" and (c.evidence or c.suggestion)]
        for c in details:
            out.append("")
            out.append(f"{c.id}: {c.summary}")
            out.extend(f"  seen: {e}" for e in c.evidence)
            if c.suggestion:
                out.append(f"  do:   {c.suggestion}")
        if self.unread:
            out.append("")
            out.append("could not read (run as root to see more):")
            out.extend(f"  {u}" for u in self.unread)
        out.append("")
        out.append(
            "something blocks RDMA (exit 1)" if self.blocking else "nothing blocks RDMA (exit 0)"
        )
        # Names, config values and the kernel log's words are the host's, not ours.
        return [safe(line) for line in out]
