"""Whether `systemctl stop|restart openibd` (MOFED/DOCA) asks rdmad's guard first.

rdmad writes a drop-in for openibd.service only while its modprobe.d hook guards
something and the unit's own ExecStop= can be read (``rdmad.openibd``): then the drop-in
runs the guard's check and after it exactly what the unit runs. This says which of those
holds, and why not when the stop cannot be known. No openibd.service: no check.
"""

from __future__ import annotations

from rdmad.doctor.fs import Root
from rdmad.doctor.report import Check
from rdmad.openibd import DROPIN, HOOK_FILE, UNIT, dropin_runs, read_unit_stop


def openibd_check(fs: Root) -> Check | None:
    stop = read_unit_stop(fs)
    if not stop.found:
        return None
    hook = fs.read(HOOK_FILE)
    guarded = hook is not None and any(ln.startswith("remove ") for ln in hook.splitlines())
    dropin = fs.read(DROPIN)
    seen = [f"read from {', '.join(stop.files)}"]
    if stop.commands is not None:
        seen.append("ExecStop: " + (" ; ".join(stop.commands) or "(none)"))
    if dropin is not None:
        seen.append(f"/{DROPIN}: runs " + (" ; ".join(dropin_runs(dropin)) or "(nothing)"))
    evidence = tuple(seen)
    if stop.commands is None:
        return Check(
            "openibd",
            "warn" if guarded else "info",
            f"{UNIT}: what its stop runs cannot be known ({stop.why}); rdmad writes no drop-in, "
            "so `systemctl stop openibd` does not ask the guard first",
            evidence,
            "make the unit's files readable; `modprobe -r` of a guarded module still asks "
            "the guard",
        )
    if not guarded:
        if dropin is not None:
            return Check(
                "openibd",
                "warn",
                f"{UNIT}: nothing is guarded, but rdmad's drop-in is there",
                evidence,
                "rdmad removes it at its next pass (is the daemon running?)",
            )
        return Check("openibd", "info", f"{UNIT}: not guarded (no guard declared)", evidence)
    if dropin is None or dropin_runs(dropin) != stop.commands:
        what = "missing" if dropin is None else "does not run what the unit runs"
        return Check(
            "openibd",
            "warn",
            f"{UNIT}: a guard is declared and rdmad's drop-in is {what}",
            evidence,
            "rdmad writes it at its next pass (is the daemon running?)",
        )
    return Check("openibd", "ok", f"{UNIT}: its stop asks the guard first", evidence)
