"""``rdmad-ctl plan`` and ``rdmad plan``: a plan (``GET /v1/plan``, or the one ``rdmad
plan`` makes itself) as the object table and the numbered changes, the same words
from both commands.
"""

from __future__ import annotations

from rdmad.ctl.render.formats import ago, clock, printable

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


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
