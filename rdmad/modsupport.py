"""Loadable kernel modules: can this kernel load any, and is a module there to load?

Three different reasons keep ``modprobe rdma_rxe`` from working, and each needs a
different fix, so each is named as it is:

* the kernel was built without ``CONFIG_MODULES``: no ``/proc/modules`` and no
  ``/proc/sys/kernel/modules_disabled`` (the sysctl exists only with module support);
  a module can only be built in;
* ``/proc/sys/kernel/modules_disabled`` is 1: no module loads (or unloads) until reboot;
* the module is not installed for the running kernel (``modules.dep`` does not list it).

Pure and standard-library only: the daemon (``rdmad.kernel.modules``, through ``Sysfs``)
and ``rdmad-ctl doctor`` (through its read-only root) read the same files with the same
code (``rdmad.peermem.facts.Reader``) and say the same words. Nothing here opens a file.
"""

from __future__ import annotations

from typing import Literal

from rdmad.peermem.facts import Reader, parse_modules_dep
from rdmad.peermem.names import MODULES_DISABLED, NO_MODULE_SUPPORT, canonical

Support = Literal["loadable", "disabled", "none"]
Availability = Literal["loaded", "builtin", "installed", "missing", "unknown"]

RXE = "rdma_rxe"
# A symbol the module defines: /proc/kallsyms lists it when the module is built in (the
# only way to tell on a kernel without module support, which has no module tree).
MARKERS = {RXE: ("rxe_net_add",)}

NO_SUPPORT = NO_MODULE_SUPPORT
DISABLED = MODULES_DISABLED


def support(fs: Reader) -> Support:
    """Whether modules can be loaded now; ``none`` when neither /proc/modules nor the
    modules_disabled sysctl exists (a kernel without CONFIG_MODULES has neither)."""
    text = fs.read("proc/sys/kernel/modules_disabled")
    if text is not None:
        return "disabled" if text.strip() == "1" else "loadable"
    if fs.exists("proc/sys/kernel/modules_disabled") or fs.exists("proc/modules"):
        return "loadable"  # the sysctl could not be read: modprobe will say more
    return "none"


def support_words(level: Support) -> str | None:
    """Why no module can be loaded, or None when modprobe may work."""
    return {"disabled": DISABLED, "none": NO_SUPPORT}.get(level)


def availability(
    fs: Reader, name: str, release: str | None, level: Support
) -> tuple[Availability, str]:
    """Whether module ``name`` is in the kernel, built in, installed for the running
    kernel, or missing; and the evidence, in words."""
    mod = canonical(name)
    if fs.exists(f"sys/module/{mod}"):
        if fs.read(f"sys/module/{mod}/initstate") is None:
            return "builtin", f"/sys/module/{mod} has no initstate (built in)"
        return "loaded", f"/sys/module/{mod}"
    if level == "none":
        return _builtin_by_symbol(fs, mod)
    if release is None:
        return "unknown", "the running kernel's release (/proc/sys/kernel/osrelease) is unreadable"
    base = f"lib/modules/{release}"
    builtin = fs.read(f"{base}/modules.builtin")
    if builtin is not None and mod in _names(builtin):
        return "builtin", f"/{base}/modules.builtin lists {mod}"
    dep = fs.read(f"{base}/modules.dep")
    if dep is not None:
        if parse_modules_dep(dep, [mod]):
            return "installed", f"/{base}/modules.dep lists {mod}"
        return "missing", f"/{base}/modules.dep has no {mod}"
    if not fs.exists(base):
        return "missing", f"/{base} does not exist"
    return "unknown", f"/{base}/modules.dep is unreadable"


def _names(listing: str) -> set[str]:
    """Module names of a modules.builtin listing ("kernel/drivers/.../rdma_rxe.ko")."""
    return {canonical(line.rsplit("/", 1)[-1].split(".ko", 1)[0]) for line in listing.split()}


def _builtin_by_symbol(fs: Reader, mod: str) -> tuple[Availability, str]:
    markers = MARKERS.get(mod, ())
    syms = fs.read_bytes("proc/kallsyms") if markers else None
    if not syms:
        return "unknown", f"no /sys/module/{mod}, and /proc/kallsyms does not tell"
    for line in syms.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2].decode(errors="replace") in markers:
            return "builtin", f"/proc/kallsyms lists {parts[2].decode(errors='replace')}"
    return "missing", f"no /sys/module/{mod}, and /proc/kallsyms has none of its symbols"


def cannot_load(
    name: str,
    level: Support,
    found: Availability,
    evidence: str = "",
    release: str | None = None,
) -> str | None:
    """Why ``name`` cannot be had by loading it, in words; None when it is in the kernel
    already (loaded, built in) or modprobe may work (installed, or not known)."""
    seen = f" ({evidence})" if evidence else ""
    if found in ("loaded", "builtin"):
        return None
    if level == "none":
        return f"{NO_SUPPORT}: {name} must be built in{seen}"
    kernel = f"the running kernel {release}" if release else "the running kernel"
    missing = f"no {name} module for {kernel}{seen}"
    if level == "disabled":
        also = f"; and {missing}" if found == "missing" else ""
        return f"{name} is not loaded and {DISABLED}{also}"
    return missing if found == "missing" else None


__all__ = [
    "DISABLED",
    "NO_SUPPORT",
    "RXE",
    "Availability",
    "Support",
    "availability",
    "cannot_load",
    "support",
    "support_words",
]
