"""The iommu check: whether RDMA DMA goes through IOMMU translation, which breaks memory
registration (``IBV_WC_LOC_PROT_ERR``, on SR-IOV VFs and for GPUDirect), and
``iommu=pt`` keeps the IOMMU with no translation for host devices (seed 003).

What it reads: /proc/cmdline; /sys/kernel/iommu_groups/*/type (``DMA`` or ``DMA-FQ`` is
translated, ``identity`` passthrough); each RDMA device's ``iommu_group``; the kernel
log's "Default domain type" line; /boot/config-RELEASE. The rule, in order:

1. an RDMA device in a translated group: warn (it fails now);
2. IOMMU groups exist: ok with ``iommu=pt`` (or ``iommu.passthrough=1``) or with every
   RDMA device in an identity group; a translated group otherwise warns when anything
   RDMA-related is here (below) and is only said when nothing is; identity groups: ok;
3. no IOMMU group: no device is behind an IOMMU, so nothing is translated now. What
   the IOMMU would do with a device it takes later (every device, VFs included, once it
   is turned on: in the firmware, with intel_iommu=on or amd_iommu=on, as VF
   passthrough needs; a VF whose PF has no group gets none either) is its default
   domain type: the kernel log's line, else the command line's iommu=pt|nopt /
   iommu.passthrough=, else the kernel's build (CONFIG_IOMMU_DEFAULT_*). Translated
   and something RDMA-related here: warn and suggest iommu=pt; translated and nothing
   RDMA-related, passthrough, or not known: info, saying which.

RDMA-related: [[sriov]] PFs or [peermem] mode auto/require declared, or present an RDMA
device made by a driver (not rxe: Soft-RoCE copies with the CPU, no device DMA), a
ConnectX PCI function or an SR-IOV VF.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from rdmad.doctor.fs import Root
from rdmad.doctor.rdmadev import PciScan, hardware_devices, scan_pci
from rdmad.doctor.report import Check
from rdmad.peermem.facts import kmsg_text

TRANSLATED = ("DMA", "DMA-FQ")
Domain = Literal["translated", "passthrough"]
FIX = (
    "add iommu=pt to the kernel command line (keeps the IOMMU for isolation, no "
    "translation for host devices), then reboot"
)
# CONFIG_IOMMU_DEFAULT_* of the kernel's build: the default domain when neither the
# command line nor memory encryption decides it.
BUILD: dict[str, Domain] = {
    "CONFIG_IOMMU_DEFAULT_PASSTHROUGH": "passthrough",
    "CONFIG_IOMMU_DEFAULT_DMA_LAZY": "translated",
    "CONFIG_IOMMU_DEFAULT_DMA_STRICT": "translated",
}


def iommu(
    fs: Root,
    log: list[str] | None,
    cfg: dict[str, Any] | None = None,
    release: str | None = None,
    pci: PciScan | None = None,
    *,
    declared: int | None = None,
) -> Check:
    """``log``: the kernel log's records, None when it could not be read; ``declared``:
    how many PFs the config's [[sriov]] apply to here (a selector counts the PFs it
    matches), by default one per [[sriov]]."""
    cmdline = fs.read("proc/cmdline")
    tokens = cmdline.split() if cmdline is not None else []
    flags = [t for t in tokens if "iommu" in t]
    groups = fs.listdir("sys/kernel/iommu_groups")
    types = Counter(fs.read(f"sys/kernel/iommu_groups/{g}/type") or "?" for g in groups)
    evidence = [f"/proc/cmdline: {' '.join(flags) or 'no iommu options'}"]
    if cmdline is None:
        evidence = ["/proc/cmdline not readable"]
    if groups:
        evidence.append(
            f"{len(groups)} IOMMU group(s): "
            + ", ".join(f"{n} {t}" for t, n in types.most_common())
        )
    logged = [kmsg_text(r) for r in log or [] if "Default domain type" in r]
    if logged:
        evidence.append(f"kernel: {logged[-1].strip()}")
    rdma_types = {}
    for dev in fs.listdir("sys/class/infiniband"):
        group = fs.link_name(f"sys/class/infiniband/{dev}/device/iommu_group")
        if group is not None:
            rdma_types[dev] = fs.read(f"sys/kernel/iommu_groups/{group}/type") or "?"
    for dev, t in sorted(rdma_types.items()):
        evidence.append(f"{dev}: IOMMU group type {t}")
    translated = sorted(d for d, t in rdma_types.items() if t in TRANSLATED)
    if translated:
        return Check(
            "iommu",
            "warn",
            f"translated DMA for {', '.join(translated)}: RDMA may fail with IBV_WC_LOC_PROT_ERR",
            tuple(evidence),
            FIX,
        )

    def related() -> list[str]:  # read only where the answer depends on it
        found = rdma_related(fs, cfg or {}, pci or (lambda: scan_pci(fs)), declared)
        evidence.append(
            f"RDMA-related: {', '.join(found)}"
            if found
            else "nothing RDMA-related: no [[sriov]] or [peermem] declared; no RDMA device "
            "other than rxe, no ConnectX function, no VF present"
        )
        return found

    if not groups:
        domain, source = default_domain(fs, log, logged, tokens, release)
        evidence.append(f"default domain: {domain or 'not known'} ({source})")
        return _no_groups(domain, related(), evidence)
    if _cmdline_domain(tokens) == "passthrough":
        option = next(t for t in reversed(tokens) if _cmdline_domain([t]) is not None)
        return Check("iommu", "ok", f"passthrough ({option})", tuple(evidence))
    if rdma_types:  # none of them translated (above)
        return Check(
            "iommu", "ok", "RDMA devices are in passthrough (identity) groups", tuple(evidence)
        )
    if any(t in TRANSLATED for t in types):
        if not related():
            return Check(
                "iommu",
                "info",
                "translated default domain; nothing RDMA-related here",
                tuple(evidence),
            )
        return Check(
            "iommu", "warn", "translated default domain and no iommu=pt", tuple(evidence), FIX
        )
    return Check("iommu", "ok", "identity (passthrough) groups", tuple(evidence))


def _no_groups(domain: Domain | None, related: list[str], evidence: list[str]) -> Check:
    """No device is behind an IOMMU: nothing is translated now; say what a device it
    takes later would get, and warn only where that matters to RDMA."""
    evidence.append(
        "with no IOMMU group, VFs made now get none either; the default domain applies "
        "once an IOMMU is on (in the firmware, intel_iommu=on / amd_iommu=on)"
    )
    now = "nothing translated now (no IOMMU groups)"
    if domain == "translated" and related:
        return Check(
            "iommu",
            "warn",
            f"{now}, but the default domain is translated: devices the IOMMU takes later, "
            "VFs included, would be (IBV_WC_LOC_PROT_ERR)",
            tuple(evidence),
            "add iommu=pt to the kernel command line (then reboot) before the IOMMU is "
            "turned on or devices are put behind it; it keeps the IOMMU for isolation, with "
            "no translation for host devices",
        )
    if domain == "translated":
        tail = "default domain translated, nothing RDMA-related here"
    else:
        tail = f"default domain {domain or 'not known'}"
    return Check("iommu", "info", f"{now}; {tail}", tuple(evidence))


def default_domain(
    fs: Root, log: list[str] | None, logged: list[str], tokens: list[str], release: str | None
) -> tuple[Domain | None, str]:
    """The IOMMU's default domain type and where it was read: the kernel log's line
    (what the kernel decided), else the command line, else the kernel's build."""
    if logged:
        words = logged[-1].split("Default domain type:", 1)[-1].strip().lower()
        if words.startswith("translated"):
            return "translated", "the kernel log"
        if words.startswith("passthrough"):
            return "passthrough", "the kernel log"
    by_cmdline = _cmdline_domain(tokens)
    if by_cmdline is not None:
        return by_cmdline, "the kernel command line"
    if release:
        config = fs.read(f"boot/config-{release}")
        for line in (config or "").splitlines():
            key, _, value = line.partition("=")
            if value.strip() == "y" and key in BUILD:
                return BUILD[key], f"/boot/config-{release}: {key}=y"
    said = "the kernel log not readable" if log is None else "no kernel log line"
    build = f"no CONFIG_IOMMU_DEFAULT_* in /boot/config-{release}" if release else "no release"
    return None, f"{said}, no iommu=pt|nopt or iommu.passthrough= option, {build}"


def _cmdline_domain(tokens: list[str]) -> Domain | None:
    """iommu=pt|nopt and iommu.passthrough=: the last one given decides."""
    found: Domain | None = None
    for token in tokens:
        key, _, value = token.partition("=")
        if key == "iommu" and value in ("pt", "nopt"):
            found = "passthrough" if value == "pt" else "translated"
        elif key == "iommu.passthrough" and value.lower() in ("1", "y", "on", "0", "n", "off"):
            found = "passthrough" if value.lower() in ("1", "y", "on") else "translated"
    return found


def rdma_related(
    fs: Root, cfg: dict[str, Any], pci: PciScan, declared: int | None = None
) -> list[str]:
    """What makes a translated IOMMU matter here, in words (empty: nothing)."""
    out = []
    pfs = len(cfg.get("sriov") or []) if declared is None else declared
    if pfs:
        out.append(f"{pfs} [[sriov]] PF(s) declared")
    mode = (cfg.get("peermem") or {}).get("mode")
    if mode in ("auto", "require"):
        out.append(f'[peermem] mode = "{mode}" declared')
    out += [f"RDMA device {d}" for d in hardware_devices(fs)[:3]]
    functions = pci()
    out += [f"ConnectX function {p}" for p in functions.connectx[:3]]
    if functions.vfs:
        out.append(f"{len(functions.vfs)} SR-IOV VF(s)")
    return out
