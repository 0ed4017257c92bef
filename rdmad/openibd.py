"""MOFED/DOCA's openibd.service: what its stop really runs, and rdmad's drop-in for it.

`systemctl stop openibd` unloads the RDMA stack. Where a driver guard is in force, the
stop must ask the guard first, and systemd has no ExecStopPre=: the drop-in resets
ExecStop= and lists the guard's check, then every command the unit itself stops with,
copied as its files say them (prefixes, specifiers and variables are systemd's to read,
the same as in the unit). What the unit runs is read from its files, not assumed: the
unit file systemd loads (the first of the unit directories that has it, a generator's
for a SysV script) and its drop-ins in name order, each ``ExecStop=`` appending and an
empty one resetting, ours left out. When that cannot be known (a file that exists and
cannot be read), no drop-in is written and ``rdmad-ctl doctor`` says why: a drop-in that
ran something else than the unit would stop the stack wrongly, or not at all.

Pure and standard-library only: the daemon (through ``Sysfs``) and ``rdmad-ctl doctor``
(through its read-only root) read the same files with this code.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple, Protocol

UNIT = "openibd.service"
DROPIN_NAME = "rdmad-guard.conf"
# Runtime: gone at reboot and written again by rdmad as it starts, while a guard is
# declared; removed with the package.
DROPIN_DIR = f"run/systemd/system/{UNIT}.d"
DROPIN = f"{DROPIN_DIR}/{DROPIN_NAME}"
# rdmad's modprobe.d hook: the modules the drop-in's check covers (rdmad.kernel.guardhook).
HOOK_FILE = "etc/modprobe.d/rdmad-guard.conf"
# systemd's unit search path for the system manager, highest priority first.
UNIT_DIRS = (
    "etc/systemd/system.control",
    "run/systemd/system.control",
    "run/systemd/transient",
    "run/systemd/generator.early",
    "etc/systemd/system",
    "run/systemd/system",
    "run/systemd/generator",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
    "run/systemd/generator.late",
)
HEADER = (
    "# Written by rdmad while a driver guard is declared ([[sriov]] driver_guard, [[rxe]]);\n"
    "# rewritten when openibd.service's own ExecStop= changes, removed when nothing is\n"
    "# guarded. Do not edit: `systemctl stop|restart openibd` asks rdmad's guard first,\n"
    "# then runs what the unit runs (its ExecStop= lines, from {files}).\n"
)


class UnitReader(Protocol):
    def read(self, rel: str) -> str | None: ...

    def listdir(self, rel: str) -> list[str]: ...

    def exists(self, rel: str) -> bool: ...

    def link_name(self, rel: str) -> str | None: ...


class UnitStop(NamedTuple):
    """openibd.service's stop as its files say it. ``found``: the unit exists (and is
    not masked); ``commands``: its ExecStop= lines in order, None when they cannot be
    known (``why`` says so); ``files``: the files they were read from."""

    found: bool
    commands: tuple[str, ...] | None = None
    why: str = ""
    files: tuple[str, ...] = ()


def read_unit_stop(fs: UnitReader) -> UnitStop:
    fragment = next((d for d in UNIT_DIRS if fs.exists(f"{d}/{UNIT}")), None)
    if fragment is None:
        return UnitStop(found=False)
    rel = f"{fragment}/{UNIT}"
    text = fs.read(rel)
    if text == "" and fs.link_name(rel) == "null":
        return UnitStop(found=False, why=f"/{rel} masks it")
    files = [rel]
    seen: set[str] = set()
    dropins: list[str] = []
    for d in UNIT_DIRS:
        for name in fs.listdir(f"{d}/{UNIT}.d"):
            # A name in a directory of higher priority hides the same name below it.
            if name.endswith(".conf") and name not in seen:
                seen.add(name)
                if name != DROPIN_NAME:  # ours, in any directory (an older package's too)
                    dropins.append(f"{d}/{UNIT}.d/{name}")
    files += sorted(dropins, key=lambda p: p.rsplit("/", 1)[1])
    commands: list[str] = []
    for f in files:
        body = text if f == rel else fs.read(f)
        if body is None:
            return UnitStop(True, None, f"/{f} could not be read", tuple(f"/{x}" for x in files))
        for value in exec_stop_values(body):
            if value:
                commands.append(value)
            else:
                commands.clear()  # an empty ExecStop= resets the list
    return UnitStop(True, tuple(commands), "", tuple(f"/{x}" for x in files))


def exec_stop_values(text: str) -> list[str]:
    """The values of ``ExecStop=`` in a unit file's [Service] section, in order,
    continuation lines (a trailing backslash) joined as systemd joins them."""
    out: list[str] = []
    section = ""
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines, "").strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, eq, value = line.partition("=")
        if eq and section == "Service" and key.strip() == "ExecStop":
            out.append(value.strip())
    return out


def dropin_runs(text: str) -> tuple[str, ...]:
    """The unit's commands a drop-in rdmad wrote runs after the guard's check (its
    ExecStop= lines after the reset and the check)."""
    values = exec_stop_values(text)
    return tuple(values[2:]) if values[:1] == [""] and len(values) > 1 else ()


def render_dropin(stop: UnitStop, guard: str) -> str:
    """The drop-in for a unit whose stop is known: the guard's check first, then the
    unit's own commands, and the end of the pause after (``guard``: the shell words that
    run the guard, as the modprobe.d hook runs it). A guard that is gone cannot judge
    and lets the stop go ahead (as the hook does)."""
    assert stop.commands is not None
    program = next((w for w in reversed(shlex.split(guard)) if w.startswith("/")), "")

    def guarded(verb: str) -> str:
        script = f"[ -e {shlex.quote(program)} ] || exit 0; exec {guard} {verb} --by {UNIT}"
        return f"/bin/sh -c {shlex.quote(script)}"

    lines = [
        HEADER.format(files=", ".join(stop.files)),
        "[Service]\n",
        "ExecStop=\n",
        f"ExecStop={guarded('stack-stop')}\n",
        *(f"ExecStop={c}\n" for c in stop.commands),
        f"ExecStopPost={guarded('stack-stopped')}\n",
    ]
    return "".join(lines)
