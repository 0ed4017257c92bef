"""``rdmad-ctl status`` and ``reload``/``reconcile``: the status document
(``GET /v1/status``, docs/API.md) as the daemon line, one line per object and the
detail of what is not converged; a trigger's answer as the pass that answered it.

Both say the daemon's verdict the same way (``verdict_word``), which ``watch`` uses too.
"""

from __future__ import annotations

from rdmad.ctl.render.formats import (
    PLAIN,
    Style,
    ago,
    errno_text,
    millis,
    plural,
    printable,
    table,
    value,
)

# The module rdmad names when none is installed (rdmad.peermem.names.CANDIDATES[0], as
# the packages spell it); not imported from there: `status` starts with formats only.
NO_MODULE_NAME = "nvidia-peermem"

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any


def status_lines(
    doc: dict[str, Any],
    now: float,
    verbose: bool = False,
    style: Style = PLAIN,
    width: int | None = None,
) -> list[str]:
    """``rdmad-ctl status``: the daemon, one line per object, then what is not converged
    (every VF and attribute with ``verbose``), then config problems and notes."""
    doc = printable(doc)
    lines = [_daemon_line(doc, now)]
    counts = doc.get("counts") or {}
    objects = doc.get("objects") or []
    tally = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    lines.append(
        f"Node {verdict_word(doc)}: {plural(len(objects), 'object')}"
        + (f", {tally}" if tally else "")
    )
    daemon = doc.get("daemon") or {}
    if daemon.get("pass_error"):
        lines.append(
            f"  passes fail: {daemon['pass_error']}; the objects below are what the last "
            "pass that worked saw"
        )
    lines += _config_lines(daemon)
    pause = daemon.get("pause")
    if pause:
        lines.append(
            f"PAUSED, no module loads and no rxe links: {pause.get('describe', '')}; "
            f"ends {ago(pause.get('until'), now)} at the latest"
        )
    if objects:
        rows = [["STATE", "OBJECT", "OBSERVED", "REASON"]]
        rows += [
            [o["state"], o["obj"], observed_summary(o), object_reason(o, now)] for o in objects
        ]
        lines.append("")
        lines += _header_bold(table(rows, style, state_col=0, width=width), style)
    else:
        lines += ["", "Nothing declared: rdmad manages nothing on this node."]
    rows = [r for o in objects for r in _detail_rows(o, verbose, style)]
    if rows:
        lines.append("")
        lines += table(rows, style, state_col=1)
    for note in daemon.get("notes") or []:
        lines.append(f"note: {note}")
    return lines


def verdict_word(doc: dict[str, Any]) -> str:
    """The daemon's verdict in one word or two: its ``converged`` decides (the exit code
    follows it), ``verdict.state`` says how it is not (docs/API.md)."""
    if doc.get("converged") is True:
        return "converged"
    state = str((doc.get("verdict") or {}).get("state"))
    return {"degraded": "DEGRADED", "starting": "NOT converged yet"}.get(state, "NOT converged")


def _header_bold(lines: list[str], style: Style) -> list[str]:
    return [style.bold(lines[0]), *lines[1:]] if lines else lines


def _daemon_line(doc: dict[str, Any], now: float) -> str:
    d = doc.get("daemon") or {}
    head = f"rdmad {doc.get('version', '?')}, pid {d.get('pid', '?')}: "
    head += "ready" if d.get("ready") else "starting (first pass not finished)"
    if d.get("dry_run"):
        head += ", DRY RUN (changes nothing)"
    passes = d.get("passes") or 0
    if passes:
        cause = d.get("last_cause") or "?"
        head += (
            f"; {plural(passes, 'pass', 'passes')}, the last {ago(d.get('last_pass_at'), now)} "
            f"({cause}, {millis(d.get('last_pass_seconds'))})"
        )
    if d.get("started_at") is not None:
        kind = d.get("start_kind")
        head += f"; started {ago(d.get('started_at'), now)}" + (f" ({kind})" if kind else "")
    return head


def _config_lines(daemon: dict[str, Any]) -> list[str]:
    errors = daemon.get("config_errors") or []
    if not errors:
        return []
    kept = (
        "last good config kept" if daemon.get("config_ok") else "no valid config: nothing managed"
    )
    return [f"config INVALID ({len(errors)} error(s)), {kept}:", *(f"  {e}" for e in errors)]


def observed_summary(obj: dict[str, Any]) -> str:
    """A few words of what the kernel shows: "4/4 VFs", "2 VFs, want 4", "netdev eth0"."""
    observed = obj.get("observed") or {}
    desired = obj.get("desired") or {}
    if obj.get("kind") == "sriov":
        have = observed.get("numvfs")
        if have is None:
            return "PF absent" if not observed.get("pci") else "VFs unknown"
        want = desired.get("numvfs")
        if want is None or want == have:
            words = f"{have}/{have} VFs" if want is not None else f"{have} VFs"
        else:
            words = f"{have} VFs, want {want}"
        guard = observed.get("guard")
        return f"{words}, guard {guard.split(' (')[0]}" if guard else words
    if obj.get("kind") == "rxe":
        if not observed.get("name"):
            return "absent"
        netdev = observed.get("netdev")
        return f"netdev {netdev}" if netdev else "no netdev"
    if obj.get("kind") == "peermem":
        return _peermem_words(observed)
    return ""


def _peermem_words(o: dict[str, Any]) -> str:
    """ "nvidia-peermem loaded", "nvidia-peermem not loaded", "no GPU driver", "no
    nvidia-peermem module for this kernel".

    ``module`` is null when no peer-memory module is loaded and none is installed for
    the running kernel (rdmad.reconcile.detail.peermem): that is said as what is
    missing, never as a "not loaded" put after a "no module" (words joined blindly
    made "no module not loaded")."""
    if not o:
        return ""
    module = o.get("module")
    if o.get("loaded"):
        return f"{module or 'peer-memory module'} loaded"
    if not o.get("gpu_driver"):
        return "no GPU driver"
    if not o.get("rdma_core"):
        return "no ib_core"
    if not module:
        return f"no {NO_MODULE_NAME} module for this kernel"
    return f"{module} not loaded"


def object_reason(obj: dict[str, Any], now: float) -> str:
    """The reason, and for a failing object its error, errno and next try."""
    reason = obj.get("reason") or ""
    error = obj.get("last_error")
    if obj.get("state") != "degraded" or not error:
        return reason
    text = f"{error}" if not reason or reason == error else f"{reason}: {error}"
    extra = [errno_text(obj.get("errno"))]
    if obj.get("failures"):
        extra.append(f"{obj['failures']} failure(s)")
    if obj.get("retry_at") is not None:
        extra.append(f"retry {ago(obj['retry_at'], now)}")
    extras = ", ".join(e for e in extra if e)
    return f"{text} [{extras}]" if extras else text


def _detail_rows(obj: dict[str, Any], verbose: bool, style: Style) -> list[list[str]]:
    """A heading and rows under it: the object's attributes and VFs that are not
    converged (all with ``verbose``), a VF's holders, and its attributes that are not
    converged. Nothing for a converged object unless ``verbose``."""
    rows: list[list[str]] = []
    for attr in obj.get("attributes") or []:
        if verbose or attr.get("state") != "converged":
            rows.append(_attr_row(attr, "  "))
    for vf in obj.get("vfs") or []:
        attrs = [a for a in vf.get("attributes") or [] if verbose or a.get("state") != "converged"]
        if not verbose and vf.get("state") == "converged" and not attrs:
            continue
        where = " ".join(x for x in (vf.get("pci"), vf.get("driver") or "no driver") if x)
        if vf.get("netdev"):
            where += f" {vf['netdev']}"
        if vf.get("representor"):
            where += f" (representor {vf['representor']})"
        where += f", {vf.get('usage', 'unknown')}"
        rows.append([f"  VF {vf.get('vf')}", vf.get("state", "?"), where, vf.get("reason") or ""])
        rows += [["    held by", "", holder, ""] for holder in vf.get("holders") or []]
        rows += [_attr_row(a, "    ") for a in attrs]
    if rows or verbose:
        state = obj.get("state", "?")
        heading = f"{obj.get('obj', '?')}: {style.paint(state, state)} ({_observed_words(obj)})"
        rows.insert(0, [heading])
    return rows


def _attr_row(attr: dict[str, Any], indent: str) -> list[str]:
    desired, observed = attr.get("desired"), attr.get("observed")
    shown = value(desired) if desired == observed else f"{value(observed)} -> {value(desired)}"
    return [f"{indent}{attr.get('name')}", attr.get("state", "?"), shown, attr.get("reason") or ""]


def _observed_words(obj: dict[str, Any]) -> str:
    o = obj.get("observed") or {}
    if obj.get("kind") == "sriov":
        parts = [o.get("pci"), o.get("driver"), o.get("netdev")]
        eswitch = o.get("eswitch")
        if isinstance(eswitch, dict) and eswitch.get("mode"):
            parts.append(f"eswitch {eswitch['mode']}")
        if o.get("numvfs") is not None:
            parts.append(f"{o['numvfs']} of {o.get('totalvfs', '?')} VFs")
        return ", ".join(str(p) for p in parts if p) or "not present"
    if obj.get("kind") == "rxe":
        if not o.get("name"):
            return "not present"
        return f"on {o.get('netdev') or '-'}, {o.get('usage', 'unknown')}"
    if obj.get("kind") == "peermem":
        findings = ", ".join(f.get("id", "?") for f in o.get("findings") or [])
        words = _peermem_words(o) or "not observed"
        return f"{words}; findings: {findings}" if findings else words
    return ""


def trigger_lines(what: str, doc: dict[str, Any], wait: float) -> list[str]:
    """The answer to ``reload``/``reconcile``."""
    doc = printable(doc)
    if doc.get("pass") is None:
        if wait <= 0:
            return [f"{what}: queued (not waiting for the pass)"]
        return [f"{what}: queued; no pass answered it within {wait:g} s"]
    return [
        f"{what}: pass {doc['pass']} ({millis(doc.get('seconds'))}): {verdict_word(doc)}",
        f"  {doc.get('summary', '')}",
    ]
