"""The doctor's RDMA netns-mode check: the mode the kernel has, the one ib_core gets at
its next load (any ``options ib_core netns_mode=`` in /etc/modprobe.d, rdmad's own file
or another), the one declared, and what keeps the kernel from changing it now (the
network namespaces ``rdmad.netnsnames`` names, as the daemon's status does)."""

from __future__ import annotations

import re
from typing import Any

from rdmad.doctor.fs import Root
from rdmad.doctor.report import Check
from rdmad.netnsnames import NETNS_MODE_PARAM, NETNS_MODES, other_namespaces

_OPTION = re.compile(r"^\s*options\s+ib_core\s+(?:.*\s)?netns_mode=([01YNyn])\b", re.M)


def boot_modes(fs: Root) -> list[tuple[str, str]]:
    """(file, mode) of every ib_core netns_mode option in /etc/modprobe.d, in the order
    modprobe reads them (the last one wins)."""
    out = []
    for name in fs.listdir("etc/modprobe.d"):
        if name.endswith(".conf"):
            for m in _OPTION.finditer(fs.read(f"etc/modprobe.d/{name}") or ""):
                out.append((f"/etc/modprobe.d/{name}", NETNS_MODES[m.group(1).upper()]))
    return out


def rdma_netns(fs: Root, cfg: dict[str, Any]) -> Check:
    declared = cfg.get("rdma", {}).get("netns_mode")
    raw = fs.read(NETNS_MODE_PARAM)
    live = NETNS_MODES.get(raw or "") if raw is not None else None
    if raw is None and fs.exists("sys/module/ib_core"):
        # Loaded (or built in) without the parameter: a kernel before 5.3, shared only.
        return Check(
            "rdma-netns",
            "info" if declared in (None, "shared") else "fail",
            "ib_core has no netns_mode parameter: this kernel has only the shared mode",
            (f"declared: {declared or 'not managed'}",),
        )
    options = boot_modes(fs)
    boot = options[-1][1] if options else "shared"
    evidence = [
        f"now: {live or 'ib_core not loaded'}",
        f"at ib_core's next load: {boot}"
        + (f" ({options[-1][0]})" if options else " (the kernel's default)"),
        f"declared: {declared or 'not managed ([rdma] netns_mode unset)'}",
    ]
    if declared is None:
        now = live or f"{boot} at ib_core's load (not loaded)"
        return Check("rdma-netns", "info", f"RDMA netns mode {now}; not managed", tuple(evidence))
    if live is None or live == declared:
        if boot != declared:
            return Check(
                "rdma-netns",
                "warn",
                f"ib_core's next load gives {boot}, declared {declared}",
                tuple(evidence),
                "start rdmad: it writes /etc/modprobe.d/rdmad-ib-core.conf",
            )
        loaded = "" if live else " (ib_core not loaded: it loads in it)"
        return Check("rdma-netns", "ok", f"RDMA netns mode {declared}{loaded}", tuple(evidence))
    try:
        seen = other_namespaces(fs)
        blocking = list(seen.labels)
        if seen.unreadable:
            evidence.append(f"{seen.unreadable} processes' namespaces not readable")
    except OSError as exc:
        blocking = []
        evidence.append(f"cannot tell which network namespaces exist: {exc.strerror or exc}")
    evidence += [f"network namespace {label}" for label in blocking]
    return Check(
        "rdma-netns",
        "fail",
        f"RDMA netns mode {live}, declared {declared}"
        + (f": {len(blocking)} other network namespace(s) block the change" if blocking else ""),
        tuple(evidence),
        "the kernel changes it only while no network namespace but the host's exists; "
        "rdmad's modprobe.d option applies it at the next boot or ib_core reload"
        + (" (remove or stop what holds the namespaces above to apply it now)" if blocking else ""),
    )
