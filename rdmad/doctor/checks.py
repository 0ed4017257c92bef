"""The doctor's checks: one function per question, each a ``Check`` from what the
host shows. Read-only: nothing here writes, loads or runs anything.

Sources (FIELD.md, seeds 002 and 003): /proc/cmdline, /sys/kernel/iommu_groups/*/type
and the default domain for the IOMMU mode (``iommu.py``, with its rule);
/sys/class/infiniband/DEV/ports/N/link_layer per port (``rdmadev.py``); /sys/module/NAME
(a built-in has no initstate and no holders) and /sys/module/mlx5_core/version (MOFED >=
23.10 for GPUDirect, seed 002); /lib/modules/RELEASE for what could be loaded; the rdmad
config, read with tomllib, for the declared PFs (named, or the PFs present that its
selectors match: ``declared``) and [peermem] mode.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

from rdmad import modsupport, pfselect
from rdmad.doctor.declared import Declared, declared_pfs, udev_pending
from rdmad.doctor.eswitch import EswitchReader, eswitch_check
from rdmad.doctor.fs import Root
from rdmad.doctor.iommu import iommu
from rdmad.doctor.managers import managers_check
from rdmad.doctor.openibd import openibd_check
from rdmad.doctor.pfs import device_dir, is_netdevsim
from rdmad.doctor.rdmadev import rdma_devices, scan_pci
from rdmad.doctor.rdmasys import rdma_netns
from rdmad.doctor.report import Check, Report, Status
from rdmad.peermem.choice import decide
from rdmad.peermem.facts import gather
from rdmad.peermem.findings import log_findings
from rdmad.peermem.names import CANDIDATES, PEER_API, modprobe_name
from rdmad.tomlfiles import read_documents

MOFED_MIN = (23, 10)  # seed 002: "Mellanox OFED drivers version 23.10 or above"
DEFAULT_CONFIG = "/etc/rdmad"


def run_checks(
    fs: Root, config: str | None = DEFAULT_CONFIG, devlink: EswitchReader | None = None
) -> Report:
    """``devlink`` answers the eSwitch questions: given only when ``fs`` is this host."""
    cfg, cfg_note = read_config(config)
    log = fs.kernel_log()
    notes = []
    if log is None:
        notes.append(
            "the kernel log (/dev/kmsg) was not readable: failures only it explains "
            "(symbol versions) are not checked, and the IOMMU default domain is read from "
            "the command line or the kernel's build config"
        )
    release = fs.read("proc/sys/kernel/osrelease")
    pci = functools.cache(lambda: scan_pci(fs))  # one pass, shared, only if asked
    declared = declared_pfs(fs, cfg)
    checks = [
        rdma_devices(fs, release, pci),
        drivers(fs),
        iommu(fs, log, cfg, release, pci, declared=len(declared.pfs)),
        module_loading(fs),
        peermem_check(fs, _declared_mode(cfg), log or []),
        rxe(fs, release, declared=bool(cfg.get("rxe"))),
        sriov(fs, declared, cfg_note),
        rdma_netns(fs, cfg),
    ]
    for extra in (
        eswitch_check(fs, declared, devlink),
        managers_check(fs, declared),
        openibd_check(fs),
    ):
        if extra is not None:
            checks.append(extra)
    if release:
        notes.insert(0, f"kernel {release}")
    unread = tuple(f"{path}: {why}" for path, why in sorted(fs.refused.items()))
    return Report(tuple(checks), unread, tuple(notes))


# --- config -----------------------------------------------------------------------------


def read_config(where: str | None) -> tuple[dict[str, Any], str | None]:
    """The declared [peermem], [rdma], [[sriov]] and [[rxe]] of rdmad's config (merged as
    rdmad merges them: key by key for the tables, later PF, selector and link entries
    win); a note when unreadable."""
    if where is None:
        return {}, "no config given"
    if not os.path.lexists(where):
        return {}, f"no config: {where} does not exist"
    docs, note = read_documents(where)
    if note is not None:
        return {}, note
    merged: dict[str, Any] = {"peermem": {}, "sriov": {}, "rdma": {}, "rxe": {}}
    for _, doc in docs:
        for table in ("peermem", "rdma"):
            if isinstance(doc.get(table), dict):
                merged[table].update(doc[table])
        for entry in doc.get("sriov", []) if isinstance(doc.get("sriov"), list) else []:
            key = _sriov_key(entry)
            if key is not None:
                merged["sriov"][key] = {**merged["sriov"].get(key, {}), **entry}
        for entry in doc.get("rxe", []) if isinstance(doc.get("rxe"), list) else []:
            if isinstance(entry, dict):
                merged["rxe"][str(entry.get("name"))] = entry
    merged["sriov"] = list(merged["sriov"].values())
    merged["rxe"] = list(merged["rxe"].values())
    if not docs:
        return merged, f"no config files in {where}"
    return merged, None


def _sriov_key(entry: object) -> tuple[str, ...] | None:
    """What a later file names to override an [[sriov]]: its ``pf`` reference, or its
    selector (a selector and a literal ``pf`` are two declarations, never merged)."""
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("pf"), dict):
        return ("pf", *sorted(f"{k}={v}" for k, v in entry["pf"].items()))
    if "pf" not in entry and isinstance(entry.get("select"), dict) and entry["select"]:
        return ("select", pfselect.identity(entry["select"]))
    return None


# --- drivers ------------------------------------------------------------------------------


def module_state(fs: Root, name: str) -> str:
    """ "module" (loaded), "built-in" (no initstate, no holders), "coming"/"going", "absent"."""
    if not fs.exists(f"sys/module/{name}"):
        return "absent"
    state = fs.read(f"sys/module/{name}/initstate")
    if state is None:
        return "built-in"
    return "module" if state == "live" else state


def drivers(fs: Root) -> Check:
    evidence = []
    status = "ok"
    suggestion = ""
    for name in ("ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib"):
        state = module_state(fs, name)
        version = fs.read(f"sys/module/{name}/version")
        evidence.append(f"{name}: {state}" + (f", version {version}" if version else ""))
    mlx5 = module_state(fs, "mlx5_core")
    version = fs.read("sys/module/mlx5_core/version")
    if mlx5 == "absent":
        summary = "no mlx5 driver (no ConnectX in use)"
        status = "info"
    elif version is None:
        summary = f"mlx5_core {mlx5}, inbox (no MOFED/DOCA version)"
        status = "info"
    else:
        m = re.match(r"(\d+)\.(\d+)", version)
        mofed = (int(m.group(1)), int(m.group(2))) if m else None
        summary = f"mlx5_core {mlx5}, MOFED/DOCA {version}"
        if mofed is not None and mofed < MOFED_MIN:
            status = "warn"
            summary += f" (older than {MOFED_MIN[0]}.{MOFED_MIN[1]})"
            suggestion = (
                "GPUDirect RDMA needs MOFED/DOCA 23.10 or newer: upgrade it, then rebuild "
                "the GPU driver's DKMS modules"
            )
    return Check("drivers", status, summary, tuple(evidence), suggestion)  # type: ignore[arg-type]


# --- modules ------------------------------------------------------------------------------


def module_loading(fs: Root) -> Check:
    level = modsupport.support(fs)
    if level == "none":
        # Neither file exists there: say so, rather than quote a value nobody can read.
        return Check(
            "module-loading",
            "info",
            f"{modsupport.NO_SUPPORT}: only built-in drivers (rdma_rxe too) can be used",
            ("/proc/modules and /proc/sys/kernel/modules_disabled do not exist",),
        )
    disabled = fs.read("proc/sys/kernel/modules_disabled")
    sig = fs.read("sys/module/module/parameters/sig_enforce")
    evidence = [
        f"/proc/sys/kernel/modules_disabled = {disabled if disabled is not None else '?'}",
        f"/sys/module/module/parameters/sig_enforce = {sig if sig is not None else '?'}",
    ]
    if level == "disabled":
        return Check(
            "module-loading",
            "warn",
            "disabled until reboot: modules not loaded now (peermem, rdma_rxe, drivers) cannot be",
            tuple(evidence),
            "load what RDMA needs before modules_disabled is set (modules-load.d), or reboot",
        )
    if disabled is None:
        return Check("module-loading", "unknown", "modules_disabled not readable", tuple(evidence))
    summary = "allowed" + (", signatures enforced" if sig == "Y" else "")
    return Check("module-loading", "ok", summary, tuple(evidence))


def _declared_mode(cfg: dict[str, Any]) -> str | None:
    """[peermem] mode as declared; None when it is not (rdmad then leaves peermem alone)."""
    mode = cfg.get("peermem", {}).get("mode")
    return str(mode) if mode is not None else None


def peermem_check(fs: Root, declared: str | None, log: list[str]) -> Check:
    """Peer memory as rdmad sees it with the declared mode. Not declared, rdmad does
    nothing about it: the node is judged as `auto` would judge it (what declaring it
    would do, and why it could not load), but nothing is a problem (info at most)."""
    mode = declared if declared in ("auto", "require", "off") else "auto"
    check, verdict = _peermem_check(fs, mode, log, loads=declared is not None)
    if declared is not None:
        return check
    status: Status = "ok" if check.status == "ok" else "info"
    # Worth declaring where rdmad would load it: a GPU driver and an RDMA core are loaded.
    advice = 'declare [peermem] mode = "auto" to have rdmad load it'
    wanted = verdict in ("load", "cannot-load")
    suggestion = "; ".join(x for x in (check.suggestion, advice if wanted else "") if x)
    return dataclasses.replace(
        check,
        status=status,
        summary=f"not declared (rdmad leaves it alone); {check.summary}",
        suggestion=suggestion,
    )


def _peermem_check(fs: Root, mode: str, log: list[str], loads: bool) -> tuple[Check, str]:
    facts = gather(fs, full=True, kernel_log=log)
    decision = decide(mode, facts)  # type: ignore[arg-type]
    findings = list(decision.findings)
    if decision.verdict not in ("loaded", "off"):
        for f in log_findings(facts.kernel_log):
            if f.id not in {x.id for x in findings}:
                findings.append(f)
    evidence = [
        f"nvidia: {'loaded' if 'nvidia' in facts.loaded else 'not loaded'}; "
        f"ib_core: {'loaded' if 'ib_core' in facts.loaded else 'not loaded'}",
        "installed: "
        + (", ".join(f"{m.path}" for m in facts.files) or "no nvidia-peermem / nvidia-p2p"),
    ]
    if facts.peer_api is not None:
        evidence.append(f"ib_core {'exports' if facts.peer_api else 'lacks'} {PEER_API}")
    evidence += [f.evidence for f in findings]
    suggestion = "; ".join(f.suggestion for f in findings if f.severity != "info")
    info = [f for f in findings if f.severity == "info"]
    blocking = [f for f in findings if f.severity == "blocking"]
    v = decision.verdict
    if v == "off":
        status, summary = "info", "[peermem] mode = off"
    elif v == "loaded":
        status, summary = "ok", decision.reason
    elif v == "not-needed":
        status, summary = "info", f"not needed now: {decision.reason}"
    elif v == "waiting":
        status, summary = "warn", f"required, but {decision.reason}"
    elif v == "load":
        status = "warn" if not blocking else "fail"
        summary = f"{modprobe_name(decision.module or '')} installed, not loaded"
        by_hand = "modprobe " + modprobe_name(decision.module or "")
        suggestion = suggestion or (f"rdmad loads it (or: {by_hand})" if loads else by_hand)
    else:
        name = modprobe_name(decision.module or CANDIDATES[0])
        ids = ", ".join(f.id for f in blocking) or "see the kernel log"
        if info and mode != "require":
            status, summary = "info", f"{name} cannot be loaded ({ids}); DMA-BUF works without it"
        else:
            status, summary = "fail", f"{name} cannot be loaded ({ids})"
    if info:
        suggestion = "; ".join(
            [*([suggestion] if suggestion else []), *(f.suggestion for f in info)]
        )
    check = Check(
        "peermem",
        status,  # type: ignore[arg-type]
        summary,
        tuple(evidence),
        suggestion,
        tuple(f.to_json() for f in findings),
    )
    return check, v


def rxe(fs: Root, release: str | None, declared: bool = False) -> Check:
    """Whether Soft-RoCE can be had, and the real reason when not (rdmad.modsupport: the
    same facts and words as the daemon's plan and status). With [[rxe]] declared, no
    rdma_rxe to load is a failure (the links cannot be made); otherwise it is only said."""
    check = _rxe(fs, release)
    if declared and check.status in ("info", "warn"):
        return dataclasses.replace(
            check, status="fail", summary=f"{check.summary}; [[rxe]] links are declared"
        )
    return check


def _rxe(fs: Root, release: str | None) -> Check:
    level = modsupport.support(fs)
    found, evidence = modsupport.availability(fs, modsupport.RXE, release, level)
    if found == "loaded":
        return Check("rxe", "ok", "rdma_rxe loaded", (evidence,))
    if found == "builtin":
        return Check("rxe", "ok", "rdma_rxe built in", (evidence,))
    why = modsupport.cannot_load(modsupport.RXE, level, found, evidence, release)
    if level == "none":
        return Check(
            "rxe",
            "info",
            why or modsupport.NO_SUPPORT,
            (evidence,),
            "Soft-RoCE needs a kernel built with CONFIG_RDMA_RXE=y here (or with module support)",
        )
    install = "install the distribution's extra kernel modules (e.g. linux-modules-extra)"
    if level == "disabled":
        return Check(
            "rxe",
            "warn",
            why or modsupport.DISABLED,
            (evidence,),
            f"{install}, then reboot"
            if found == "missing"
            else "load rdma_rxe before modules_disabled is set (modules-load.d), or reboot",
        )
    if found == "installed":
        return Check(
            "rxe", "ok", "rdma_rxe available (not loaded; rdmad loads it for [[rxe]])", (evidence,)
        )
    if found == "missing":
        return Check(
            "rxe",
            "info",
            f"{why}: Soft-RoCE unavailable",
            (evidence,),
            install,
        )
    return Check("rxe", "unknown", evidence)


# --- SR-IOV -------------------------------------------------------------------------------


def sriov(fs: Root, declared: Declared, note: str | None) -> Check:
    """Each PF the config applies to here (literal or matched by a selector) can take
    its VFs; selectors with no PF of their own here are said, not failed (the daemon has
    nothing to do for them either)."""
    if note is not None and not declared.entries:
        status = "info" if note.startswith("no config") else "unknown"  # nothing declared
        return Check("sriov", status, f"declared PFs not checked: {note}")  # type: ignore[arg-type]
    if not declared.entries:
        return Check("sriov", "info", "no PF declared")
    evidence, bad = [], []
    for pf in declared.pfs:
        want = pf.entry.get("numvfs")
        pci = pf.dev
        if pci is None:
            bad.append(pf.label)
            evidence.append(f"pf {pf.label}: not present")
            continue
        base = device_dir(pci)
        total = fs.read(f"{base}/sriov_totalvfs")
        if total is None and is_netdevsim(pci) and fs.exists(f"{base}/sriov_numvfs"):
            evidence.append(f"pf {pf.label} ({pci}): a netdevsim test device")
            continue
        driver = fs.link_name(f"{base}/driver")
        if total is None:
            bad.append(pf.label)
            evidence.append(f"pf {pf.label} ({pci}): not SR-IOV capable (no sriov_totalvfs)")
            continue
        udev = udev_pending(fs, pci) if driver is None else None
        if udev is not None and udev.unread:
            driver = f"no driver; {pfselect.udev_unknown_words(udev.unread)}"
        elif udev is not None and udev.pending:
            driver = "no driver yet: udev has not processed it (at boot)"
        line = f"pf {pf.label} ({pci}, {driver or 'no driver'}): up to {total} VFs"
        if isinstance(want, int) and want > int(total):
            bad.append(pf.label)
            line += f", {want} declared"
        evidence.append(line + _autoprobe_note(fs, base, pf.entry.get("autoprobe")))
    evidence += declared.refused
    evidence += declared.idle
    count = len(declared.pfs) + len(declared.refused)
    if bad or declared.refused:
        return Check(
            "sriov",
            "fail",
            f"{len(bad) + len(declared.refused)} of {count} declared PF(s) cannot take their VFs",
            tuple(evidence),
            "check the PF references and selectors in rdmad.toml (by PCI address is "
            "safest) and that SR-IOV is enabled in the firmware/BIOS",
        )
    if not declared.pfs:
        return Check(
            "sriov",
            "info",
            f"no declared PF here: {len(declared.idle)} selector(s), nothing to do",
            tuple(evidence),
        )
    return Check(
        "sriov", "ok", f"{len(declared.pfs)} declared PF(s) SR-IOV capable", tuple(evidence)
    )


def _autoprobe_note(fs: Root, base: str, declared: object) -> str:
    """sriov_drivers_autoprobe as seen, and as declared when it differs (rdmad writes it
    before it makes VFs; a VF made while it was 1 keeps the host's driver)."""
    raw = fs.read(f"{base}/sriov_drivers_autoprobe")
    if raw is None:
        return "" if declared is None else ", no sriov_drivers_autoprobe (autoprobe declared)"
    seen = raw.strip() not in ("0", "")
    note = f", autoprobe {int(seen)}"
    if isinstance(declared, bool) and declared != seen:
        note += f" (declared {int(declared)}: rdmad writes it at its next pass)"
    return note
