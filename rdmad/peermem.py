"""GPUDirect peer memory: which module applies, when to load it, and why it cannot load.

Pure and standard-library only, because two very different programs decide with it:
the daemon's planner (``rdmad.reconcile.peermem``) and ``rdmad-ctl doctor``
(``rdmad.doctor``, which must start fast and never pull the config schema). Both must say the
same thing in the same words about the same node.

Nothing here opens a file. ``gather()`` asks a ``Reader`` it is given: the kernel
layer's ``Sysfs(root)`` in the daemon, the doctor's read-only root in rdmad-ctl; so
one function knows which files matter, and tests hand it fake trees.

The facts (seeds 002, FIELD.md): ``nvidia-peermem`` (dGPU) or ``nvidia-p2p``
(Jetson/IGX iGPU) needs the GPU driver (``nvidia``) and the RDMA core (``ib_core``)
loaded first; it needs an ``ib_core`` that exports ``ib_register_peer_memory_client``
(MOFED/DOCA; inbox kernels do not), built in the right order (MOFED before the GPU
driver's DKMS modules, else "disagrees about version of symbol"). DMA-BUF (kernel
>= 5.12 with ``ib_umem_dmabuf_get``, open GPU kernel modules) needs no peermem at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

GPU_DRIVER = "nvidia"
RDMA_CORE = "ib_core"
# In order of preference: a dGPU system has nvidia-peermem, an iGPU one nvidia-p2p.
CANDIDATES = ("nvidia_peermem", "nvidia_p2p")
PEER_API = "ib_register_peer_memory_client"
DMABUF_SYMBOL = "ib_umem_dmabuf_get"
DMABUF_KERNEL = (5, 12)
# Modules whose arrival or departure can change the decision (udev "module" events).
RELEVANT = frozenset({GPU_DRIVER, RDMA_CORE, "mlx5_ib", "mlx5_core", "ib_uverbs", *CANDIDATES})
SIGNATURE_MAGIC = b"~Module signature appended~\n"
# How the kernel layer appends the kernel log's lines to a failed modprobe's words.
KERNEL_LOG_SEP = "; kernel log: "
# Why no module can be loaded (rdmad.modsupport tells which applies, for every module).
MODULES_DISABLED = "module loading is disabled until reboot (/proc/sys/kernel/modules_disabled = 1)"
NO_MODULE_SUPPORT = "this kernel has no loadable module support (built without CONFIG_MODULES)"

Mode = Literal["auto", "require", "off"]
Severity = Literal["info", "warning", "blocking"]


def canonical(name: str) -> str:
    """The kernel's spelling of a module name (sysfs, /proc/modules): '-' becomes '_'."""
    return name.replace("-", "_")


def modprobe_name(name: str) -> str:
    """How the packages name the module (``modprobe nvidia-peermem``)."""
    return name.replace("_", "-")


# --- facts -------------------------------------------------------------------------------


class Reader(Protocol):
    """Read-only access to a host's /sys, /proc and /lib/modules, paths relative to a root."""

    def read(self, rel: str) -> str | None: ...

    def listdir(self, rel: str) -> list[str]: ...

    def exists(self, rel: str) -> bool: ...

    def read_bytes(self, rel: str) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class ModuleFile:
    """A peer-memory module installed for the running kernel."""

    name: str  # canonical
    path: str  # relative to /lib/modules/RELEASE, as modules.dep spells it
    signed: bool | None = None  # None: could not tell (compressed, unreadable)
    needs_peer_api: bool | None = None  # references ib_register_peer_memory_client
    size: int | None = None  # notices a rebuild (DKMS) that no module event reports


@dataclass(frozen=True, slots=True)
class PeermemFacts:
    """What the kernel and the module tree show, as plain values (cheap to compare)."""

    release: str | None = None
    loaded: frozenset[str] = frozenset()  # relevant modules, live or built in
    builtin: frozenset[str] = frozenset()
    files: tuple[ModuleFile, ...] = ()  # installed candidates, in CANDIDATES order
    modules_dep: bool = True  # /lib/modules/RELEASE/modules.dep was readable
    loading_disabled: bool | None = False  # None: unreadable
    module_support: bool = True  # False: built without CONFIG_MODULES (nothing can load)
    sig_enforce: bool | None = False
    peer_api: bool | None = None  # ib_core exports PEER_API; None: not known
    dmabuf_symbol: bool | None = None
    open_gpu_modules: bool | None = None  # nvidia without the proprietary taint
    kernel_log: tuple[str, ...] = ()  # kernel log lines about the candidates
    unread: tuple[str, ...] = ()  # what could not be read, in words
    probed: bool = True  # False: only the cheap facts were read (no GPU driver around)

    def fingerprint(self) -> tuple[object, ...]:
        """What a lasting failure depends on: when it changes, trying again makes sense."""
        return (
            self.release,
            self.loaded,
            self.files,
            self.loading_disabled,
            self.module_support,
            self.sig_enforce,
            self.peer_api,
        )

    def module(self) -> ModuleFile | None:
        """The peer-memory module that applies: the first candidate installed."""
        return self.files[0] if self.files else None

    def loaded_module(self) -> str | None:
        return next((m for m in CANDIDATES if m in self.loaded), None)

    def prerequisites(self) -> list[str]:
        """What must be loaded before peermem and is not."""
        return [m for m in (GPU_DRIVER, RDMA_CORE) if m not in self.loaded]


def kernel_version(release: str | None) -> tuple[int, int] | None:
    if not release:
        return None
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_modules_dep(text: str, wanted: Iterable[str]) -> dict[str, str]:
    """Canonical module name -> path, for the wanted names, from modules.dep text."""
    want = set(wanted)
    out: dict[str, str] = {}
    for line in text.splitlines():
        path, sep, _ = line.partition(":")
        if not sep:
            continue
        base = path.rsplit("/", 1)[-1]
        name = canonical(base.split(".ko", 1)[0])
        if name in want and name not in out:
            out[name] = path.strip()
    return out


def parse_proc_modules(text: str) -> dict[str, str]:
    """Module -> state ("Live", "Loading", "Unloading") from /proc/modules."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5:
            out[parts[0]] = parts[4]
    return out


def is_signed(data: bytes) -> bool:
    """An uncompressed module ends with the signature marker when it is signed."""
    return data.rstrip(b"\0").endswith(SIGNATURE_MAGIC)


def exports(kallsyms: bytes, symbol: str) -> bool:
    """Whether /proc/kallsyms text names ``symbol`` ("ADDR T NAME\t[module]" lines)."""
    return (
        re.search(rb"[ \t]" + re.escape(symbol.encode()) + rb"(?:[ \t\n]|$)", kallsyms) is not None
    )


def kmsg_text(record: str) -> str:
    """The message of a /dev/kmsg record ("6,123,456,-;text"); other lines as they are."""
    head, sep, text = record.partition(";")
    if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", head):
        return text
    return record


def gather(fs: Reader, *, full: bool = True, kernel_log: Sequence[str] = ()) -> PeermemFacts:
    """Read the facts. ``full`` False reads only what says peermem is not needed now
    (the loaded modules and the switches): the module tree and kallsyms are read only
    when a GPU driver or a peermem module is around."""
    unread: list[str] = []
    release = fs.read("proc/sys/kernel/osrelease")
    if release is None:
        unread.append("/proc/sys/kernel/osrelease (running kernel release)")
    proc = fs.read("proc/modules")
    states = parse_proc_modules(proc) if proc is not None else {}
    present = set(fs.listdir("sys/module"))
    builtin = frozenset(m for m in present if m in RELEVANT and m not in states)
    disabled_text = fs.read("proc/sys/kernel/modules_disabled")
    disabled = None if disabled_text is None else disabled_text.strip() == "1"
    # Without CONFIG_MODULES neither file exists: that is an answer, not a failed read.
    supported = not (
        proc is None
        and disabled_text is None
        and not fs.exists("proc/modules")
        and not fs.exists("proc/sys/kernel/modules_disabled")
    )
    if proc is None:
        # No /proc/modules: a module is loaded when its initstate says live; none = built in.
        loaded = {
            m for m in present if m in RELEVANT and fs.read(f"sys/module/{m}/initstate") != "coming"
        }
        if supported:
            unread.append("/proc/modules")
    else:
        loaded = {m for m, s in states.items() if m in RELEVANT and s == "Live"} | builtin
    if disabled is None and supported and fs.exists("proc/sys/kernel"):
        unread.append("/proc/sys/kernel/modules_disabled")
    sig = fs.read("sys/module/module/parameters/sig_enforce")
    sig_enforce = sig.strip() == "Y" if sig is not None else None
    if sig_enforce is None and "module.sig_enforce=1" in (fs.read("proc/cmdline") or "").split():
        sig_enforce = True
    facts = PeermemFacts(
        release=release,
        loaded=frozenset(loaded),
        builtin=builtin,
        loading_disabled=disabled,
        module_support=supported,
        sig_enforce=sig_enforce,
        probed=False,
        unread=tuple(unread),
    )
    if not full:
        return facts
    return _gather_more(fs, facts, unread, kernel_log)


def _gather_more(
    fs: Reader, facts: PeermemFacts, unread: list[str], kernel_log: Sequence[str]
) -> PeermemFacts:
    files: list[ModuleFile] = []
    has_dep = True
    if facts.release is not None:
        base = f"lib/modules/{facts.release}"
        dep = fs.read(f"{base}/modules.dep")
        if dep is None:
            has_dep = False
            found = _search_tree(fs, base, CANDIDATES)
            if not fs.exists(base):
                unread.append(f"/{base} (no modules for the running kernel)")
        else:
            found = parse_modules_dep(dep, CANDIDATES)
        for name in CANDIDATES:
            if name in found:
                files.append(_module_file(fs, name, f"{base}/{found[name]}", found[name]))
    syms = fs.read_bytes("proc/kallsyms")
    peer_api = dmabuf = None
    if syms is not None and syms:
        peer_api = exports(syms, PEER_API)
        dmabuf = exports(syms, DMABUF_SYMBOL)
        if RDMA_CORE not in facts.loaded:
            # kallsyms lists only what is loaded: without ib_core it cannot say no.
            peer_api = peer_api or None
            dmabuf = dmabuf or None
    else:
        unread.append("/proc/kallsyms (exported symbols of ib_core)")
    if peer_api is None and facts.release is not None:
        peer_api = _ib_core_file_exports(fs, facts.release)
    taint = fs.read(f"sys/module/{GPU_DRIVER}/taint")
    open_gpu = None if taint is None else "P" not in taint
    lines = tuple(t for t in (kmsg_text(r) for r in kernel_log) if any(c in t for c in CANDIDATES))
    return PeermemFacts(
        release=facts.release,
        loaded=facts.loaded,
        builtin=facts.builtin,
        files=tuple(files),
        modules_dep=has_dep,
        loading_disabled=facts.loading_disabled,
        module_support=facts.module_support,
        sig_enforce=facts.sig_enforce,
        peer_api=peer_api,
        dmabuf_symbol=dmabuf,
        open_gpu_modules=open_gpu,
        kernel_log=lines[-20:],
        unread=tuple(unread),
        probed=True,
    )


def _search_tree(fs: Reader, base: str, names: Sequence[str], depth: int = 6) -> dict[str, str]:
    """Without modules.dep: look for NAME.ko* under the kernel's module tree (bounded)."""
    out: dict[str, str] = {}
    stack = [("", 0)]
    while stack:
        rel, level = stack.pop()
        for entry in fs.listdir(f"{base}/{rel}" if rel else base):
            sub = f"{rel}/{entry}" if rel else entry
            if ".ko" in entry:
                name = canonical(entry.split(".ko", 1)[0])
                if name in names and name not in out:
                    out[name] = sub
            elif level < depth and "." not in entry:
                stack.append((sub, level + 1))
    return out


def module_bytes(fs: Reader, rel: str) -> bytes | None:
    """A module file's content, decompressed when xz or gzip compressed (the kernel
    signs before compressing, so the signature marker is inside); None for zstd
    (no decompressor in the standard library) or an unreadable file."""
    if rel.endswith(".ko"):
        return fs.read_bytes(rel)
    if not rel.endswith((".ko.xz", ".ko.gz")):
        return None
    data = fs.read_bytes(rel)
    if data is None:
        return None
    import gzip  # only for compressed modules
    import lzma

    try:
        return lzma.decompress(data) if rel.endswith(".xz") else gzip.decompress(data)
    except (lzma.LZMAError, OSError, EOFError):  # a damaged file: could not tell
        return None


def _module_file(fs: Reader, name: str, rel: str, path: str) -> ModuleFile:
    data = module_bytes(fs, rel)
    if data is None:
        return ModuleFile(name, path)
    return ModuleFile(
        name,
        path,
        signed=is_signed(data),
        needs_peer_api=PEER_API.encode() in data,
        size=len(data),
    )


def _ib_core_file_exports(fs: Reader, release: str) -> bool | None:
    """Whether the installed ib_core.ko exports PEER_API (its __ksymtab strings)."""
    base = f"lib/modules/{release}"
    dep = fs.read(f"{base}/modules.dep")
    if dep is None:
        return None
    path = parse_modules_dep(dep, [RDMA_CORE]).get(RDMA_CORE)
    if path is None:
        return None
    data = module_bytes(fs, f"{base}/{path}")
    return None if data is None else b"__ksymtab_" + PEER_API.encode() in data


# --- findings ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
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
    version = kernel_version(facts.release)
    if version is None or version < DMABUF_KERNEL:
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


# --- the decision ------------------------------------------------------------------------

Verdict = Literal["off", "not-needed", "loaded", "load", "cannot-load", "waiting"]


@dataclass(frozen=True, slots=True)
class Held:
    """A lasting failure the daemon remembers: not retried while the facts are the same."""

    module: str
    finding: Finding
    fingerprint: tuple[object, ...] = field(compare=False, default=())


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    module: str | None  # the canonical module that applies (to load, or loaded)
    reason: str
    findings: tuple[Finding, ...] = ()

    @property
    def blocking(self) -> Finding | None:
        return next((f for f in self.findings if f.severity == "blocking"), None)


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
