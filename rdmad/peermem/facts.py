"""The facts peer memory is decided on: which modules are loaded or built in, which
peer-memory module is installed for the running kernel (signed? needing MOFED's peer
API?), the module switches (modules_disabled, sig_enforce, no module support at all),
what ib_core exports, and the kernel log's lines about the candidates.

Nothing here opens a file: ``gather()`` asks a ``Reader`` it is given, the kernel
layer's ``Sysfs(root)`` in the daemon and the doctor's read-only root in rdmad-ctl, so
one function knows which files matter and tests hand it fake trees. The findings and
the decision (``findings.py``, ``choice.py``) read only the ``PeermemFacts`` it returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from rdmad.peermem.names import (
    CANDIDATES,
    DMABUF_KERNEL,
    DMABUF_MODULE,
    DMABUF_SYMBOL,
    GPU_DRIVER,
    PEER_API,
    RDMA_CORE,
    VERBS_CLASS,
    canonical,
)

# Modules whose arrival or departure can change the decision (udev "module" events).
RELEVANT = frozenset({GPU_DRIVER, RDMA_CORE, "mlx5_ib", "mlx5_core", DMABUF_MODULE, *CANDIDATES})
SIGNATURE_MAGIC = b"~Module signature appended~\n"


class Reader(Protocol):
    """Read-only access to a host's /sys, /proc and /lib/modules, paths relative to a root."""

    def read(self, rel: str) -> str | None: ...

    def listdir(self, rel: str) -> list[str]: ...

    def exists(self, rel: str) -> bool: ...

    def read_bytes(self, rel: str) -> bytes | None: ...


class ModuleFile(NamedTuple):
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
    dmabuf_symbol: bool | None = None  # ib_uverbs has DMABUF_SYMBOL; None: not known
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


def dmabuf_kernel(release: str | None) -> bool:
    """Whether the kernel is new enough for RDMA memory from a DMA-BUF (5.12)."""
    version = kernel_version(release)
    return version is not None and version >= DMABUF_KERNEL


def parse_modules_dep(text: str, wanted: Iterable[str]) -> dict[str, str]:
    """Canonical module name -> path, for the wanted names, from modules.dep text
    ("PATH: DEPS" lines, as depmod writes them; the first line naming a module wins).

    Only the lines that hold a name's longest piece without '_' are parsed (a file's
    '-' is the module's '_', so that piece is spelled the same in both): a distribution
    kernel's modules.dep has ~6,000 lines and a pass wants one or two of them. Parsing
    every line was 7 of the ~21 ms of a GPU node's first pass on the host bench
    (bench/bench_start.py, 6,000 modules)."""
    out: dict[str, str] = {}
    for name in dict.fromkeys(wanted):
        piece = max(name.split("_"), key=len)
        at = text.find(piece)
        while at != -1:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end == -1 else end
            path = _dep_line_path(text[start:end], name)
            if path is not None:
                out[name] = path
                break
            at = text.find(piece, end + 1)  # the next line that holds it
    return out


def _dep_line_path(line: str, name: str) -> str | None:
    """The module path of one modules.dep line when its module is ``name``."""
    path, sep, _ = line.partition(":")
    if not sep:
        return None
    base = path.rsplit("/", 1)[-1]
    return path.strip() if canonical(base.split(".ko", 1)[0]) == name else None


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
    """Whether /proc/kallsyms text names ``symbol`` ("ADDR T NAME\t[module]" lines).

    A search for the name's bytes, each hit then checked for a whole word: a regular
    expression that starts with a character class tries every position of the text
    (24 ms for a real node's 154,000 lines, two such searches per peer-memory probe);
    ``bytes.find`` skips through it (under a millisecond)."""
    name = symbol.encode()
    at = kallsyms.find(name)
    while at != -1:
        end = at + len(name)
        if kallsyms[at - 1 : at] in (b" ", b"\t") and kallsyms[end : end + 1] in _AFTER_NAME:
            return True
        at = kallsyms.find(name, end)
    return False


_AFTER_NAME = (b"", b" ", b"\t", b"\n")  # what may follow a whole symbol name


def kmsg_text(record: str) -> str:
    """The message of a /dev/kmsg record ("6,123,456,-;text"); other lines as they are."""
    head, sep, text = record.partition(";")
    if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", head):
        return text
    return record


def gather(
    fs: Reader,
    *,
    full: bool = True,
    kernel_log: Sequence[str] = (),
    all_symbols: bool = True,
) -> PeermemFacts:
    """Read the facts. ``full`` False reads only what says peermem is not needed now
    (the loaded modules and the switches): the module tree and kallsyms are read only
    when a GPU driver or a peermem module is around.

    ``all_symbols`` False (the daemon's passes): what ib_core exports (/proc/kallsyms, or
    its module file) is read only where a finding can turn on it: the peer-memory API for
    a module that needs it or cannot be told, the DMA-BUF symbol for its info finding
    (kernel >= 5.12, the open GPU modules). The kernel formats /proc/kallsyms as it is
    read: 55-85 ms for 122,000 lines on the host bench's VM, more than the rest of a
    pass. The doctor reads them always, to show them.

    The DMA-BUF symbol is looked up in the kernel's BTF first (``_btf_dmabuf``), a
    buffer the kernel copies out as it is: kallsyms is read for it only where the BTF
    is missing or does not name it."""
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
    return _gather_more(fs, facts, unread, kernel_log, all_symbols)


def _gather_more(
    fs: Reader,
    facts: PeermemFacts,
    unread: list[str],
    kernel_log: Sequence[str],
    all_symbols: bool,
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
    taint = fs.read(f"sys/module/{GPU_DRIVER}/taint")
    open_gpu = None if taint is None else "P" not in taint
    # What a finding can turn on (findings.preflight, dmabuf_finding, diagnose's words).
    wants_peer_api = all_symbols or bool(files and files[0].needs_peer_api is not False)
    # Without ib_uverbs nothing has the DMA-BUF symbol now: its arrival is a module event.
    verbs = DMABUF_MODULE in facts.loaded or fs.exists(VERBS_CLASS)
    wants_dmabuf = verbs and (all_symbols or (open_gpu is True and dmabuf_kernel(facts.release)))
    peer_api = None
    dmabuf = _btf_dmabuf(fs, facts) if wants_dmabuf else None
    if wants_peer_api or (wants_dmabuf and dmabuf is None):
        syms = fs.read_bytes("proc/kallsyms")
        if syms is not None and syms:
            peer_api = exports(syms, PEER_API)
            if RDMA_CORE not in facts.loaded:
                # kallsyms lists only what is loaded: without ib_core it cannot say no.
                peer_api = peer_api or None
            if dmabuf is None and verbs:
                dmabuf = exports(syms, DMABUF_SYMBOL)
        else:
            unread.append("/proc/kallsyms (exported symbols of ib_core)")
        if peer_api is None and wants_peer_api and facts.release is not None:
            peer_api = _ib_core_file_exports(fs, facts.release)
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


def btf_names(btf: bytes, name: str) -> bool:
    """Whether BTF data (/sys/kernel/btf/*) holds ``name`` in its string section, where
    each name is stored once and ends with a NUL (so does the string before it)."""
    return b"\0" + name.encode() + b"\0" in btf


def _btf_dmabuf(fs: Reader, facts: PeermemFacts) -> bool | None:
    """True when the BTF of the code that holds DMABUF_SYMBOL names it: ib_uverbs' own
    while it is a loaded module, vmlinux's when it is built in. None where there is no
    BTF (a kernel without CONFIG_DEBUG_INFO_BTF, a module built without it) or it does
    not name the function (pahole leaves some out): /proc/kallsyms then decides.

    The kernel copies BTF out as it is: ib_uverbs' 55 KB in 2-4 ms in the lab's TCG
    guest, where /proc/kallsyms takes 600-700 ms; vmlinux's 5.5 MB in 6-8 ms on the host
    bench's VM against 55-64 ms for its kallsyms."""
    module = DMABUF_MODULE in facts.loaded and DMABUF_MODULE not in facts.builtin
    data = fs.read_bytes(f"sys/kernel/btf/{DMABUF_MODULE if module else 'vmlinux'}")
    return True if data and btf_names(data, DMABUF_SYMBOL) else None


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
