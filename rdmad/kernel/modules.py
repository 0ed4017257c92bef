"""Kernel modules: what is loaded, who holds it, its parameters, and modprobe.

Reads go through ``Sysfs`` (so the tests use a fake tree); loading and unloading
run ``/sbin/modprobe`` as an asyncio subprocess with an argv list (never a shell)
and a timeout. modprobe, not the init_module syscall, because modprobe resolves
dependencies, aliases (``vfio-pci`` -> ``vfio_pci``), ``/etc/modprobe.d`` options,
blacklists and the ``install``/``remove`` hooks the guard relies on.

modprobe's own words are the error a user sees ("modprobe: FATAL: Module foo not
found in directory /lib/modules/6.1.0-..."): it says more than any errno would.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_mod
import os
import re
from collections.abc import Collection, Mapping

import msgspec

from rdmad import modsupport
from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import Sysfs
from rdmad.peermem import KERNEL_LOG_SEP, canonical

MODPROBE = "/sbin/modprobe"
DEFAULT_TIMEOUT = 120.0  # a PF driver with many VFs takes seconds to load under TCG
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
_PARAM_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ModuleInfo(msgspec.Struct, frozen=True):
    """One loaded module as /sys/module/NAME shows it."""

    name: str
    refcnt: int | None  # None: built in, or the kernel did not say
    holders: tuple[str, ...] = ()
    params: Mapping[str, str | None] = msgspec.field(default_factory=dict)

    @property
    def in_use(self) -> bool:
        """Held by another module or by open references; modprobe -r would refuse."""
        return bool(self.holders) or bool(self.refcnt)


class Modules:
    """Read-only view of the kernel's modules through ``Sysfs``."""

    def __init__(self, sysfs: Sysfs) -> None:
        self.sysfs = sysfs

    def loaded(self) -> frozenset[str]:
        """Modules present in the kernel: loaded ones ("live") and built-ins.

        A built-in (no initstate) is as good as loaded for rdmad: modprobe of it
        succeeds and changes nothing, so the planner must not ask for it again.
        Built-ins without parameters have no /sys/module entry and are missed.
        Modules still coming or already going are not counted.
        """
        # /proc/modules names every loadable module with its state in one read (the
        # per-module initstate walk below costs ~0.2 s per observation under TCG);
        # a /sys/module entry it does not list is a built-in.
        proc = self.sysfs.read("proc/modules")
        if proc is not None:
            states = {}
            for line in proc.splitlines():
                parts = line.split()
                if len(parts) >= 5:
                    states[parts[0]] = parts[4]
            live = {name for name, state in states.items() if state == "Live"}
            builtin = {n for n in self.sysfs.listdir("sys/module") if n not in states}
            return frozenset(live | builtin)
        out = set()
        for name in self.sysfs.listdir("sys/module"):
            state = self.sysfs.read(f"sys/module/{name}/initstate")
            if state in (None, "live"):
                out.add(name)
        return frozenset(out)

    def is_loaded(self, name: str) -> bool:
        mod = canonical(name)
        if not self.sysfs.exists(f"sys/module/{mod}"):
            return False
        return self.sysfs.read(f"sys/module/{mod}/initstate") in (None, "live")

    def info(self, name: str) -> ModuleInfo | None:
        """Refcount, holders and parameters of a loaded module; None when not loaded."""
        mod = canonical(name)
        if not self.is_loaded(mod):
            return None
        return ModuleInfo(
            name=mod,
            refcnt=self.sysfs.module_refcnt(mod),
            holders=tuple(self.sysfs.module_holders(mod)),
            params=self.sysfs.module_params(mod),
        )

    def param(self, name: str, param: str) -> str | None:
        return self.sysfs.read(f"sys/module/{canonical(name)}/parameters/{param}")

    def support(self) -> modsupport.Support:
        """loadable, disabled (``modules_disabled`` = 1, one-way until reboot), or none (a
        kernel built without loadable module support has neither that sysctl nor
        /proc/modules)."""
        return modsupport.support(self.sysfs)

    def loading_disabled_reason(self) -> str | None:
        """Why no module can be loaded now, or None when modprobe may work."""
        return modsupport.support_words(self.support())

    def loading_disabled(self) -> bool:
        return self.loading_disabled_reason() is not None


class ModuleProbe:
    """Whether the modules rdmad may load (``rdma_rxe``) are in the kernel, can be
    loaded, or why not (``rdmad.modsupport``), for each observation.

    Only the modules asked about (those a plan on the declaration may load:
    ``ObserveScope.modules``) and not loaded are looked up, and the module tree
    (modules.dep is about a megabyte on a distribution kernel; /proc/kallsyms without
    module support) is read again only when it changed (depmod).
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._answer: tuple[frozenset[str], tuple[tuple[str, str], ...]] = (frozenset(), ())

    def facts(
        self,
        sysfs: Sysfs,
        loaded: frozenset[str],
        level: modsupport.Support,
        names: Collection[str],
    ) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
        """(those built in, (module, why it cannot be loaded) for those that cannot)."""
        wanted = tuple(sorted(n for n in names if canonical(n) not in loaded))
        if not wanted:
            return frozenset(), ()
        release = sysfs.read("proc/sys/kernel/osrelease")
        base = f"lib/modules/{release}"
        key = (
            release,
            level,
            wanted,
            tuple(sysfs.exists(f"sys/module/{canonical(n)}") for n in wanted),
            sysfs.stamp(f"{base}/modules.dep") if release else None,
            sysfs.stamp(f"{base}/modules.builtin") if release else None,
        )
        if key != self._key:
            builtin, unavailable = set(), []
            for name in wanted:
                found, evidence = modsupport.availability(sysfs, name, release, level)
                if found == "builtin":
                    builtin.add(name)
                why = modsupport.cannot_load(name, level, found, evidence, release)
                if why is not None:
                    unavailable.append((name, why))
            self._key, self._answer = key, (frozenset(builtin), tuple(unavailable))
        return self._answer


def _check_name(name: str, op: str) -> None:
    # A name starting with '-' would be read as an option: refuse rather than quote.
    if not _NAME_RE.match(name):
        raise KernelError(op, "", errno_mod.EINVAL, f"not a module name: {name!r}")


def _param_args(params: Mapping[str, object] | None, op: str) -> list[str]:
    out = []
    for key, value in (params or {}).items():
        text = str(int(value)) if isinstance(value, bool) else str(value)
        if not _PARAM_RE.match(key) or any(c.isspace() for c in text):
            raise KernelError(op, "", errno_mod.EINVAL, f"not a module parameter: {key}={text!r}")
        out.append(f"{key}={text}")
    return out


async def modprobe(
    name: str,
    params: Mapping[str, object] | None = None,
    *,
    sysfs: Sysfs | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    program: str = MODPROBE,
) -> None:
    """``modprobe NAME [key=value ...]``; raises KernelError quoting modprobe's stderr.

    Refuses up front when module loading is disabled: modprobe would only say
    "Operation not permitted", which does not tell the user it is for good.
    """
    op = f"modprobe {name}"
    _check_name(name, op)
    args = _param_args(params, op)
    reason = Modules(sysfs or Sysfs("/")).loading_disabled_reason()
    if reason is not None:
        raise KernelError(op, "", errno_mod.EPERM, reason)
    fs = sysfs or Sysfs("/")
    log_fd = fs.open_kernel_log(at_end=True)  # what the kernel says about this load only
    try:
        await _run(op, [program, "--", name, *args], timeout)
    except KernelError as exc:
        lines = kernel_log_about(fs.read_kernel_log(log_fd), name) if log_fd is not None else []
        log_fd = None
        if not lines:
            raise
        # "Unknown symbol in module, or unknown parameter (see dmesg)": the kernel log
        # says which (e.g. "disagrees about version of symbol ..."), so it goes along.
        raise KernelError(
            op, "", None, f"{exc.detail}{KERNEL_LOG_SEP}{' | '.join(lines)}"
        ) from None
    finally:
        if log_fd is not None:
            os.close(log_fd)


def kernel_log_about(records: list[str], name: str, keep: int = 5) -> list[str]:
    """The last kernel log messages naming a module (its kernel spelling or modprobe's)."""
    mod = canonical(name)
    out = []
    for record in records:
        head, sep, text = record.partition(";")
        text = text if sep and "," in head else record
        if mod in text or name in text:
            out.append(text.strip())
    return out[-keep:]


async def modprobe_remove(
    name: str,
    *,
    sysfs: Sysfs | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    program: str = MODPROBE,
) -> None:
    """``modprobe -r NAME``: unloads it and its now unused dependencies, runs remove hooks."""
    op = f"modprobe -r {name}"
    _check_name(name, op)
    if (sysfs or Sysfs("/")).modules_disabled():
        raise KernelError(
            op, "", errno_mod.EPERM, "module unloading is disabled (modules_disabled = 1)"
        )
    await _run(op, [program, "-r", "--", name], timeout)


async def _run(op: str, argv: list[str], timeout: float) -> None:
    """Run modprobe; its stderr (or stdout) becomes the error text on a non-zero exit."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )
    except OSError as exc:
        raise KernelError(op, "", exc.errno, f"cannot run {argv[0]}: {exc.strerror}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        await _kill(proc)
        raise KernelError(
            op, "", errno_mod.ETIMEDOUT, f"{argv[0]} did not finish within {timeout:g} s"
        ) from None
    except asyncio.CancelledError:
        await _kill(proc)
        raise
    if proc.returncode != 0:
        words = (err or out).decode(errors="replace").strip() or (
            f"{os.path.basename(argv[0])} exited with status {proc.returncode}"
        )
        raise KernelError(op, "", None, words)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the modprobe we started (by its own pid) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5.0)
