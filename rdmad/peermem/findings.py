"""Findings: named diagnoses of why peer memory cannot load, with the evidence seen and
the fix to suggest, in the same words for the daemon and ``rdmad-ctl doctor``.

``preflight`` says so from the facts before any modprobe; ``diagnose`` turns a failed
modprobe (its stderr and the kernel log) into one; ``log_findings`` reads an earlier
failure from the kernel log alone (the doctor); ``dmabuf_finding`` says when GPUDirect
RDMA needs no peer-memory module at all. Apart from the facts (``facts.py``) because a
finding is read by three different callers: the decision, the status detail and the
agent that ran modprobe.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NamedTuple

from rdmad.peermem.facts import PeermemFacts, dmabuf_kernel, kmsg_text
from rdmad.peermem.names import (
    CANDIDATES,
    DMABUF_SYMBOL,
    MODULES_DISABLED,
    NO_MODULE_SUPPORT,
    PEER_API,
    canonical,
    modprobe_name,
)

Severity = Literal["info", "warning", "blocking"]


class Finding(NamedTuple):
    """A named diagnosis: what was seen (evidence) and what to do (suggestion).

    ``lasting``: it cannot change until something else changes (a module event, a
    config reload, a rebuilt module file), so the daemon does not retry meanwhile.
    """

    id: str
    severity: Severity
    evidence: str
    suggestion: str
    lasting: bool = False

    def describe(self) -> str:
        return f"{self.id}: {self.evidence}; {self.suggestion}"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "severity": self.severity,
            "evidence": self.evidence,
            "suggestion": self.suggestion,
            "lasting": self.lasting,
        }


ORDER_HINT = (
    "install MOFED/DOCA before the GPU driver, or rebuild the GPU driver's DKMS modules "
    "after it (dpkg-reconfigure nvidia-dkms-VERSION / dkms autoinstall), then reload rdmad"
)


def preflight(facts: PeermemFacts) -> list[Finding]:
    """Findings that say, before any modprobe, that loading peermem cannot work now."""
    out: list[Finding] = []
    if not facts.module_support:
        out.append(
            Finding(
                "no-module-support",
                "blocking",
                NO_MODULE_SUPPORT,
                "the GPU driver and its peer-memory module are loadable modules: run a kernel "
                "built with CONFIG_MODULES",
                lasting=True,
            )
        )
        return out
    if facts.loading_disabled:
        out.append(
            Finding(
                "modules-disabled",
                "blocking",
                MODULES_DISABLED,
                "load the peer-memory module before modules_disabled is set (modules-load.d), "
                "or reboot",
                lasting=True,
            )
        )
        return out
    module = facts.module()
    if module is None and facts.probed:
        where = f"/lib/modules/{facts.release or '?'}"
        names = " or ".join(modprobe_name(c) for c in CANDIDATES)
        out.append(
            Finding(
                "module-not-found",
                "blocking",
                f"no {names} module for the running kernel in {where}"
                + ("" if facts.modules_dep else " (no modules.dep there)"),
                "install the GPU driver's peer-memory module for this kernel (the NVIDIA "
                "driver packages ship nvidia-peermem; rebuild DKMS modules after a kernel "
                "upgrade), or use DMA-BUF with the open GPU kernel modules",
                lasting=True,
            )
        )
        return out
    if module is None:
        return out
    if facts.sig_enforce and module.signed is False:
        out.append(
            Finding(
                "unsigned-module",
                "blocking",
                f"module signature enforcement is on (sig_enforce = Y) and {module.path} "
                "carries no signature",
                "sign the module with a key the kernel trusts (enroll it with mokutil for "
                "Secure Boot), or install signed GPU driver packages",
                lasting=True,
            )
        )
    if module.needs_peer_api and facts.peer_api is False:
        out.append(
            Finding(
                "no-peer-memory-api",
                "blocking",
                f"{module.path} needs {PEER_API}, which this kernel's ib_core does not export "
                "(an inbox RDMA stack, not MOFED/DOCA)",
                "install MOFED/DOCA and rebuild the GPU driver's DKMS modules against it, "
                "or use DMA-BUF (kernel >= 5.12, open GPU kernel modules) without peermem",
                lasting=True,
            )
        )
    return out


def dmabuf_finding(facts: PeermemFacts) -> Finding | None:
    """GPUDirect RDMA through DMA-BUF needs no peermem: say so when the node can do it."""
    if not dmabuf_kernel(facts.release):
        return None
    if not facts.dmabuf_symbol or not facts.open_gpu_modules:
        return None
    return Finding(
        "dmabuf-available",
        "info",
        f"kernel {facts.release} exports {DMABUF_SYMBOL} and the loaded nvidia module is "
        "an open GPU kernel module",
        "GPUDirect RDMA works through DMA-BUF without a peer-memory module "
        "(NCCL, UCX and libfabric use it when peermem is absent)",
    )


_STDERR_RULES: tuple[tuple[str, str], ...] = (
    (r"not found in directory", "module-not-found"),
    (r"Key was rejected by service|Required key not available", "unsigned-module"),
    (r"Operation not permitted|modules_disabled", "modules-disabled"),
)
_LOG_RULES: tuple[tuple[str, str], ...] = (
    (r"disagrees about version of symbol", "symbol-version-mismatch"),
    (r"[Uu]nknown symbol", "unknown-symbol"),
    (r"[Uu]nknown parameter|[Ii]nvalid parameter", "invalid-parameter"),
    (r"module verification failed|[Ll]oading of unsigned module .* rejected", "unsigned-module"),
)


def diagnose(
    module: str, error: str, kernel_log: Sequence[str] = (), facts: PeermemFacts | None = None
) -> Finding:
    """Turn a failed ``modprobe MODULE`` (its stderr) and the kernel log into a finding."""
    mod = canonical(module)
    log_lines = [t for t in (kmsg_text(r) for r in kernel_log) if mod in t or module in t]
    # Kernel log lines are the precise ones ("disagrees about version of symbol X").
    for line in reversed(log_lines):
        for pattern, fid in _LOG_RULES:
            if re.search(pattern, line):
                return _finding(fid, module, line.strip(), facts)
    first = error.strip().splitlines()[0] if error.strip() else f"modprobe {module} failed"
    for pattern, fid in _STDERR_RULES:
        if re.search(pattern, error):
            return _finding(fid, module, first, facts)
    if re.search(r"[Uu]nknown symbol in module", error):
        # modprobe's own words lump both together; the kernel log was not readable.
        return _finding("unknown-symbol", module, first, facts)
    if re.search(r"Invalid argument", error):
        return _finding("load-rejected", module, first, facts)
    return Finding(
        "modprobe-failed",
        "blocking",
        first,
        "see `journalctl -k` for the kernel's reason; rdmad retries with backoff",
    )


def log_findings(kernel_log: Sequence[str]) -> list[Finding]:
    """Findings the kernel log alone shows about a peer-memory module (an earlier failed
    load by someone else, at boot from modules-load.d): for the doctor."""
    out: list[Finding] = []
    for module in CANDIDATES:
        lines = [kmsg_text(r) for r in kernel_log if module in r]
        for line in reversed(lines):
            hit = next((fid for pattern, fid in _LOG_RULES if re.search(pattern, line)), None)
            if hit is not None:
                out.append(_finding(hit, module, line.strip(), None))
                break
    return out


def _finding(fid: str, module: str, evidence: str, facts: PeermemFacts | None) -> Finding:
    name = modprobe_name(module)
    if fid == "symbol-version-mismatch":
        return Finding(
            fid,
            "blocking",
            evidence,
            f"{name} and ib_core were built apart: " + ORDER_HINT,
            lasting=True,
        )
    if fid == "unknown-symbol":
        inbox = facts is not None and facts.peer_api is False
        why = (
            f"this ib_core lacks {PEER_API} (inbox RDMA stack): install MOFED/DOCA, then "
            + ORDER_HINT
            if inbox
            else f"{name} was built against other modules than the loaded ones: " + ORDER_HINT
        )
        return Finding(fid, "blocking", evidence, why, lasting=True)
    if fid == "invalid-parameter":
        return Finding(
            fid,
            "blocking",
            evidence,
            f"remove the unknown option from /etc/modprobe.d/ lines for {name}",
            lasting=True,
        )
    if fid == "unsigned-module":
        return Finding(
            fid,
            "blocking",
            evidence,
            "sign the module with a key the kernel trusts (mokutil --import), or install "
            "signed GPU driver packages",
            lasting=True,
        )
    if fid == "load-rejected":
        return Finding(
            fid,
            "blocking",
            evidence + " (the kernel log, which says why, was not readable)",
            f"read `journalctl -k | grep {module}`; after a MOFED/DOCA upgrade this is "
            "most often a symbol-version mismatch: " + ORDER_HINT,
            lasting=True,
        )
    if fid == "modules-disabled":
        return Finding(
            fid,
            "blocking",
            evidence,
            "load the peer-memory module before modules_disabled is set, or reboot",
            lasting=True,
        )
    return Finding(
        "module-not-found",
        "blocking",
        evidence,
        f"install {name} for the running kernel (the GPU driver packages ship it)",
        lasting=True,
    )
