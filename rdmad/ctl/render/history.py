"""``rdmad-ctl history`` and ``watch``: history entries (``GET /v1/history``) as table
rows, and each server-sent event of ``/v1/events`` (a status or a history entry) as
one line. ``why_text`` words an entry's error, reason and cause for both, and for the
saved state's changes (``saved.py``).
"""

from __future__ import annotations

import json
import time

from rdmad.ctl.render.formats import PLAIN, Style, clock, errno_text, printable
from rdmad.ctl.render.status import verdict_word
from rdmad.text import safe

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def history_rows(entries: Iterable[dict[str, Any]]) -> list[list[str]]:
    entries = printable(list(entries))
    rows = [["TIME", "EVENT", "OBJECT", "WHAT", "WHY"]]
    rows += [
        [
            clock(e.get("at")),
            e.get("event", "?"),
            e.get("obj") or "-",
            e.get("what") or "-",
            why_text(e),
        ]
        for e in entries
    ]
    return rows


def why_text(entry: dict[str, Any]) -> str:
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
        why = why_text(doc)
        return f"{stamp} {style.paint(kind, kind)} {what}" + (f"  {why}" if why else "")
    return f"{stamp} {event} {data}"
