"""The line of a key in a config file, for error messages (``FILE:LINE: key: problem``).

tomllib gives values, not positions, and no well-kept TOML parser that keeps them is
a dependency here, so this reads the file's lines the simple way TOML is written:
``[table]`` and ``[[array]]`` headers (``[[sriov.vf]]`` counted within their
``[[sriov]]``), then ``key = value`` lines. A key inside an inline table or an inline
array (``pf = { pci = ... }``, ``vf = [ {...} ]``) gets the line of the key that holds
it. Where the key is not found (a multi-line string, an unusual layout) there is no
line, and the message names the key alone, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from rdmad.config.errors import ConfigError

_ARRAY = re.compile(r"^\[\[\s*([A-Za-z0-9_.-]+)\s*\]\]")
_TABLE = re.compile(r"^\[\s*([A-Za-z0-9_.-]+)\s*\]")
_PART = re.compile(r"([A-Za-z0-9_-]+)(?:\[(\d+)\])?")


def _parts(path: str) -> list[tuple[str, int | None]]:
    """'sriov[0].vf[1].mac' -> [('sriov', 0), ('vf', 1), ('mac', None)]."""
    out: list[tuple[str, int | None]] = []
    for piece in path.split("."):
        m = _PART.fullmatch(piece)
        if m is None:
            return []
        out.append((m.group(1), None if m.group(2) is None else int(m.group(2))))
    return out


def _assigns(line: str, key: str) -> bool:
    return re.match(rf"^\s*{re.escape(key)}\s*=", line) is not None


def line_of(text: str, path: str) -> int | None:
    """The 1-based line that declares ``path`` in ``text``, or None."""
    parts = _parts(path)
    if not parts:
        return None
    lines = text.splitlines()
    headers: list[tuple[int, str, bool]] = []  # (line index, name, [[array]])
    for n, line in enumerate(lines):
        m = _ARRAY.match(line.strip()) or _TABLE.match(line.strip())
        if m:
            headers.append((n, m.group(1), line.strip().startswith("[[")))
    # The scope the next part is looked up in: its keys' lines, and the headers that
    # may belong to it (its descendants'). The top level: everything.
    keys = (0, headers[0][0] if headers else len(lines))
    inside = headers
    found: int | None = None
    prefix = ""
    for name, index in parts:
        dotted = f"{prefix}.{name}" if prefix else name
        hit = _header(inside, dotted, index)
        if hit is not None:
            position = headers.index(hit)
            later = headers[position + 1 :]
            keys = (hit[0] + 1, later[0][0] if later else len(lines))
            descendants = []
            for header in later:
                if not header[1].startswith(f"{dotted}."):
                    break
                descendants.append(header)
            inside = descendants
            found = hit[0] + 1
            prefix = dotted
            continue
        # A key of this scope: its value may be an inline table or array holding the
        # rest of the path, so its line is the answer.
        for n in range(*keys):
            if _assigns(lines[n], name):
                return n + 1
        return found
    return found


def _header(
    headers: list[tuple[int, str, bool]], dotted: str, index: int | None
) -> tuple[int, str, bool] | None:
    """The ``index``-th ``[[dotted]]`` header, or the ``[dotted]`` one, among ``headers``."""
    matching = [h for h in headers if h[1] == dotted and h[2] == (index is not None)]
    if index is None:
        return matching[0] if matching else None
    return matching[index] if index < len(matching) else None


def with_lines(errors: Iterable[ConfigError]) -> list[ConfigError]:
    """``errors`` with the line of their key where their file shows it."""
    texts: dict[str, str | None] = {}
    out = []
    for err in errors:
        if err.line is None and err.path:
            if err.file not in texts:
                try:
                    texts[err.file] = Path(err.file).read_text(errors="replace")
                except OSError:
                    texts[err.file] = None
            text = texts[err.file]
            line = line_of(text, err.path) if text is not None else None
            if line is not None:
                err = msgspec.structs.replace(err, line=line)
        out.append(err)
    return out
