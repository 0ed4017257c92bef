"""What every rdmad-ctl document is printed with: colour (``Style``), terminal-safe
strings (``printable``), small formats (durations, times, values, errnos) and the
aligned ``table``.

Apart from the documents' renderers so that each of them (status, plan, history,
config, the saved state) shares one way of writing a time or a table, and colour is a
``Style`` decision made once by the caller (a TTY, no NO_COLOR); widths are measured
on the plain text.
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
    come from others. Every document's text entry point (the modules beside this one)
    starts with it; ``--json`` prints the document as it came (JSON escapes control
    characters itself)."""
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


def write_lines(lines: Iterable[str], write: Callable[[str], object]) -> None:
    for line in lines:
        write(line + "\n")
