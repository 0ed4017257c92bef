"""``rdmad-ctl status`` when the daemon is down: what the state file saved (read by
``rdmad.ctl.offline``) as lines: when it was written and in which boot, the rxe links
rdmad created, the last change and error per object and the recent history.
"""

from __future__ import annotations

from rdmad.ctl.render.formats import ago, clock, printable, table
from rdmad.ctl.render.history import history_rows, why_text

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any


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
            rows.append([obj, ago(_num(a.get("at")), now), str(a.get("what", "")), why_text(a)])
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
