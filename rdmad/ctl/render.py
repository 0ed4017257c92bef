"""Text for people: the API's documents (docs/API.md) as tables and lines.

Pure functions from a document (and the time now) to lines, so the golden tests
pin exactly what an operator reads. Colour is a ``Style`` decision made once by
the caller (a TTY, no NO_COLOR); widths are measured on the plain text.
"""

from __future__ import annotations

import errno as _errno
import json
import time

from rdmad.text import safe

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

# ANSI SGR per state: red = needs a person, yellow = on its way, magenta = left alone.
_COLOURS = {
    "converged": "32",
    "pending": "33",
    "waiting": "33",
    "blocked": "31",
    "degraded": "31;1",
    "unsupported-by-driver": "35",
    "drift-on-in-use-vf": "35",
    "failed": "31",
    "applied": "32",
}


class Style:
    """Colour or not; ``paint`` wraps text that is already padded."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def paint(self, text: str, state: str) -> str:
        code = _COLOURS.get(state.strip())
        if not self.colour or not code or not text.strip():
            return text
        return f"\x1b[{code}m{text}\x1b[0m"

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.colour else text


PLAIN = Style(False)


def printable(doc: Any) -> Any:
    """A copy of a document (or any JSON value) with every string, keys too, made safe
    for a terminal (``rdmad.text.safe``): names, holders' ``comm``, reasons and errors
    come from others. Every text entry point below starts with it; ``--json`` prints
    the document as it came (JSON escapes control characters itself)."""
    if isinstance(doc, str):
        return safe(doc)
    if isinstance(doc, dict):
        return {printable(k): printable(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [printable(v) for v in doc]
    return doc


# --- small formats ------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h10m, 3d04h: precise when short, coarse when long."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


def ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    delta = now - at
    return f"in {duration(-delta)}" if delta < 0 else f"{duration(delta)} ago"


def clock(at: float | None) -> str:
    """Local wall time, to the second (the time zone is the operator's)."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def millis(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} us"


def value(v: Any) -> str:
    """A desired/observed JSON value as an operator reads it (null: not set/reported)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, str):
        return v or '""'
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def errno_text(num: Any) -> str:
    """``EBUSY (16)`` for 16; '' for no errno."""
    if not isinstance(num, int) or isinstance(num, bool):
        return ""
    name = _errno.errorcode.get(num)
    return f"{name} ({num})" if name else f"errno {num}"


def table(
    rows: Sequence[Sequence[str]],
    style: Style = PLAIN,
    state_col: int | None = None,
    width: int | None = None,
    indent: str = "",
) -> list[str]:
    """Columns aligned on the plain text; the last column is not padded and, with a
    ``width`` (a terminal), cut to fit rather than wrapped into the next line."""
    if not rows:
        return []
    cols = max(len(r) for r in rows)
    # A last cell is never padded, so it does not widen its column (a one-cell row is
    # a heading across the table).
    widths = [max((len(r[i]) for r in rows if i < len(r) - 1), default=0) for i in range(cols)]
    out = []
    for row in rows:
        cells = []
        used = len(indent)
        for i, cell in enumerate(row):
            text = cell
            if i < len(row) - 1:
                text = cell.ljust(widths[i])
                used += len(text) + 2
            elif width is not None and used + len(cell) > width and width - used >= 20:
                # Cut to the line; when not even 20 characters are left, wrapping reads better.
                text = cell[: width - used - 1] + "…"
            if state_col == i:
                text = style.paint(text, cell)
            cells.append(text)
        out.append(indent + "  ".join(cells).rstrip())
    return out


# --- status -------------------------------------------------------------------------------


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
    """ "nvidia-peermem loaded", "nvidia-peermem not loaded", "no GPU driver"."""
    if not o:
        return ""
    if o.get("loaded"):
        return f"{o.get('module') or 'peermem'} loaded"
    if not o.get("gpu_driver"):
        return "no GPU driver"
    if not o.get("rdma_core"):
        return "no ib_core"
    return f"{o.get('module') or 'no module'} not loaded"


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


# --- plan ---------------------------------------------------------------------------------


def plan_body(
    objects: Iterable[tuple[str, str, str]], actions: Iterable[dict[str, Any]]
) -> list[str]:
    """The object table and the numbered changes, as ``rdmad plan`` has always printed
    them. ``objects``: (object, state, reason); ``actions``: docs/API.md's plan actions
    (obj, kind, describe, reason, changes_kernel)."""
    objects, actions = printable(list(objects)), printable(list(actions))
    width = max([len(o[0]) for o in objects] + [6])
    lines = [f"{'OBJECT':<{width}}  STATE"]
    for obj, state, reason in objects:
        msg = "" if state == "converged" else f"  ({reason})"
        lines.append(f"{obj:<{width}}  {state}{msg}")
    lines.append("")
    if not actions:
        lines.append("Nothing to do: the node matches its declaration.")
        return lines
    todo = [a for a in actions if a.get("changes_kernel")]
    lines.append(f"Plan: {len(todo)} change(s), in order")
    n = 0
    for a in actions:
        if a.get("changes_kernel"):
            n += 1
            lines.append(f"{n:>2}. [{a.get('obj')}] {a.get('describe')}")
            lines.append(f"      because: {a.get('reason')}")
        else:
            lines.append(f"  - [{a.get('obj')}] {a.get('describe')}")
    return lines


def plan_lines(doc: dict[str, Any], now: float, source: str) -> list[str]:
    """``GET /v1/plan`` as text: where it came from, then ``plan_body``."""
    doc = printable(doc)
    made = f"made {ago(doc.get('at'), now)} ({clock(doc.get('at'))})"
    head = f"The running rdmad's next pass ({source}), {made}"
    if doc.get("dry_run"):
        head += "; the daemon runs --dry-run: it will record these, not apply them"
    objects = [
        (o.get("obj", "?"), o.get("state", "?"), o.get("reason", ""))
        for o in doc.get("objects") or []
    ]
    return [head, "", *plan_body(objects, doc.get("actions") or [])]


# --- history and events -------------------------------------------------------------------


def history_rows(entries: Iterable[dict[str, Any]]) -> list[list[str]]:
    entries = printable(list(entries))
    rows = [["TIME", "EVENT", "OBJECT", "WHAT", "WHY"]]
    rows += [
        [
            clock(e.get("at")),
            e.get("event", "?"),
            e.get("obj") or "-",
            e.get("what") or "-",
            _why(e),
        ]
        for e in entries
    ]
    return rows


def _why(entry: dict[str, Any]) -> str:
    parts = []
    if entry.get("error"):
        err = errno_text(entry.get("errno"))
        parts.append(f"error: {entry['error']}" + (f" [{err}]" if err else ""))
    if entry.get("reason"):
        parts.append(str(entry["reason"]))
    text = "; ".join(parts)
    if entry.get("cause"):
        text += f" (cause: {entry['cause']})"
    return text.strip()


def event_line(event: str, data: str, now: float, style: Style = PLAIN) -> str:
    """One line per server-sent event for ``watch``."""
    try:
        doc = printable(json.loads(data))
    except ValueError:
        doc = None
    event, data = safe(event), safe(data)
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    if event == "status" and isinstance(doc, dict):
        verdict = verdict_word(doc)
        counts = doc.get("counts") or {}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing declared"
        word = style.paint(verdict, "converged" if doc.get("converged") else "pending")
        return f"{stamp} status   pass {doc.get('passes', '?')}: {word}: {tally}"
    if event == "history" and isinstance(doc, dict):
        stamp = time.strftime("%H:%M:%S", time.localtime(doc.get("at") or now))
        kind = doc.get("event", "?")
        what = ": ".join(x for x in (doc.get("obj"), doc.get("what")) if x)
        why = _why(doc)
        return f"{stamp} {style.paint(kind, kind)} {what}" + (f"  {why}" if why else "")
    return f"{stamp} {event} {data}"


# --- config, mutations, snapshot ----------------------------------------------------------


def config_lines(doc: dict[str, Any]) -> list[str]:
    raw = doc.get("values") or []  # values as JSON text: json.dumps escapes them itself
    doc = printable(doc)
    files = doc.get("files") or []
    lines = [f"config files: {', '.join(files) if files else 'none (nothing declared)'}"]
    errors = doc.get("errors") or []
    if errors:
        lines.append(
            f"config INVALID ({len(errors)} error(s)); the daemon keeps the last good one:"
        )
        lines += [f"  {e}" for e in errors]
    else:
        lines.append("config valid")
    values = doc.get("values") or []
    if values:
        rows = [["KEY", "VALUE", "FROM"]]
        for v, r in zip(values, raw, strict=True):
            where = str(v.get("file") or "(default)")
            if v.get("file_key") and v.get("file_key") != v.get("key"):
                where += f": {v['file_key']}"
            rows.append([str(v.get("key")), json.dumps(r.get("value")), where])
        lines += ["", *table(rows)]
    return lines


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


def offline_lines(state: dict[str, Any], now: float, recent: int = 10) -> list[str]:
    """What the state file holds, for ``status`` when the daemon is down."""
    state = printable(state)
    path = state["file"]
    if not state["readable"]:
        return [f"No saved state to show: {state['problem']}"]
    lines = [f"What rdmad saved: {path}"]
    if state["problem"]:
        lines.append(f"  note: {state['problem']}")
    written = state.get("written_at")
    lines.append(f"  written {ago(written, now)} ({clock(written)})")
    if state.get("this_boot") is True:
        lines.append("  in this boot: the kernel state it describes may still be in place")
    elif state.get("this_boot") is False:
        lines.append(
            "  in an earlier boot: the node rebooted since; VFs and rxe links are gone "
            "until rdmad runs again"
        )
    if state.get("started_at"):
        lines.append(f"  that rdmad started {ago(state['started_at'], now)}")
    if state["managed_rxe"]:
        lines.append(f"  rxe links it created: {', '.join(state['managed_rxe'])}")
    applied = state["applied"]
    if applied:
        rows = [["OBJECT", "WHEN", "WHAT", "WHY"]]
        for obj, a in sorted(applied.items()):
            rows.append([obj, ago(_num(a.get("at")), now), str(a.get("what", "")), _why(a)])
        lines += ["", "Last change per object:", *table(rows, indent="  ")]
    errors = state["last_errors"]
    if errors:
        rows = [["OBJECT", "WHEN", "FAILURES", "ERROR"]]
        for obj, e in sorted(errors.items()):
            rows.append(
                [
                    obj,
                    ago(_num(e.get("at")), now),
                    str(e.get("failures", "?")),
                    str(e.get("error", "")),
                ]
            )
        lines += ["", "Last errors:", *table(rows, indent="  ")]
    history = state["history"]
    if history:
        shown = history[-recent:]
        lines += ["", f"Recent history (last {len(shown)} of {len(history)}):"]
        lines += table(history_rows(shown), indent="  ")
    return lines


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def write_lines(lines: Iterable[str], write: Callable[[str], object]) -> None:
    for line in lines:
        write(line + "\n")
