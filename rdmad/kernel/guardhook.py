"""rdmad's modprobe.d file: `modprobe -r` of a guarded module asks the guard first.

    remove igb [ -e /usr/lib/rdmad/bin/python3 ] || exec /sbin/modprobe -r --ignore-remove igb; \
        exec /usr/lib/rdmad/bin/python3 -I -m rdmad.guard remove igb        (one line)

modprobe runs a ``remove`` command instead of unloading the module itself; a command
that fails makes `modprobe -r` fail ("Error running remove command for igb") and
nothing is unloaded. The guard decides from the kernel directly (it needs no daemon),
and when it allows the unload it runs ``/sbin/modprobe -r --ignore-remove igb``
itself (``--ignore-remove`` keeps that modprobe from running this command again): so
it pauses rdmad only for an unload that goes ahead and ends the pause when the
unload failed (rdmad.guard.cli). Files older rdmad wrote (``... hook igb && exec
/sbin/modprobe -r --ignore-remove igb``) still work, and are rewritten as not current.

modprobe runs the command with /bin/sh. It is the interpreter rdmad itself runs under
(``sys.executable``): in the package it is the private venv's, and a path that names
it needs no $PATH, which modprobe's callers do not always have. ``-I`` keeps the
caller's environment (PYTHONPATH, user site) out of a root process. Where rdmad runs
in a container, the command is the host copy of the guard instead
(``rdmad.kernel.guardkit``, set with ``use_command``), run as ``/bin/sh DIR/hook``: a
script on a ``noexec`` mount would fail with 126, refusing every `modprobe -r`. Either
way the line first tests that the file the command needs is there (``needed_file``): a
guard that is gone (the package removed under a stale file, the interpreter removed by
a distribution upgrade, a container's copy deleted) cannot judge, and the unload goes
ahead instead of failing every `modprobe -r`.
What cannot be guarded this way (`rmmod`, a sysfs unbind) is said in the README.

Standard library only (the guard reads this file to know what a stack stop checks).
"""

from __future__ import annotations

import re
import shlex
import sys

from rdmad import openibd
from rdmad.fileio import write_or_remove
from rdmad.kernel.sysfs import Sysfs
from rdmad.model.shared_observed import GuardHookObserved

HOOK_FILE = openibd.HOOK_FILE  # etc/modprobe.d/rdmad-guard.conf
MODPROBE = "/sbin/modprobe"
HEADER = (
    "# Written by rdmad from [[sriov]] driver_guard and [[rxe]]; rewritten on every change\n"
    "# of the config and removed when nothing is guarded. Do not edit: `modprobe -r` of each\n"
    "# module below first asks rdmad's guard whether something still uses it.\n"
)
_MODULE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_REMOVE = re.compile(r"^remove\s+(\S+)\s")


_command: str | None = None  # use_command(): the guard's host copy, for this process


def use_command(command: str | None) -> None:
    """Hooks this process writes run ``command`` (shell words; its first word the
    program) instead of this interpreter's guard; None: back to that."""
    global _command  # noqa: PLW0603 - one deployment mode for the whole process
    _command = command


def guard_command() -> str:
    """The shell words that run the guard: the host copy when one is in use, else the
    interpreter running this process."""
    if _command is not None:
        return _command
    return f"{shlex.quote(sys.executable)} -I -m rdmad.guard"


def needed_file(command: str) -> str:
    """The file the guard command cannot run without: its last absolute path (the
    interpreter of ``python3 -I -m rdmad.guard``, the script of ``/bin/sh DIR/hook``)."""
    words = shlex.split(command)
    return next((w for w in reversed(words) if w.startswith("/")), words[0])


def render(modules: list[str] | tuple[str, ...], command: str) -> str:
    lines = [HEADER]
    for module in sorted(set(modules)):
        if not _MODULE.match(module):
            raise ValueError(f"not a module name: {module!r}")
        program = shlex.quote(needed_file(command))
        unguarded = f"{MODPROBE} -r --ignore-remove {module}"
        lines.append(
            f"remove {module} [ -e {program} ] || exec {unguarded}; "
            f"exec {command} remove {module}\n"
        )
    return "".join(lines)


def guarded_modules(text: str) -> frozenset[str]:
    """The modules a hook file's ``remove`` lines name."""
    return frozenset(
        m.group(1).replace("-", "_") for m in map(_REMOVE.match, text.splitlines()) if m
    )


def observe_hook(sysfs: Sysfs, command: str | None = None) -> GuardHookObserved:
    text = sysfs.read(HOOK_FILE)
    if text is None:
        return GuardHookObserved()
    modules = guarded_modules(text)
    try:
        current = text == render(sorted(modules), command or guard_command()).strip()
    except ValueError:
        current = False
    return GuardHookObserved(modules=modules, current=current, present=True)


def write_hook(sysfs: Sysfs, modules: list[str] | tuple[str, ...], command: str) -> None:
    """Write the hook atomically (a reader sees the old file or the new); none: remove it."""
    write_or_remove(sysfs.path(HOOK_FILE), render(modules, command).encode() if modules else None)


def driver_module(sysfs: Sysfs, device_dir: str) -> str | None:
    """The module behind a device's driver; None when unbound or built in.

    A built-in driver has the ``module`` link too when its module has parameters (igb,
    mlx5_core): /sys/module/NAME then exists without ``initstate``, which only a
    loadable module has. It can never be unloaded: nothing to guard."""
    name = sysfs.link_name(f"{device_dir}/driver/module")
    if name is None or not sysfs.exists(f"sys/module/{name}/initstate"):
        return None
    return name
