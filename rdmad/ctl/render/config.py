"""``rdmad-ctl config``: the config document (``GET /v1/config``) as the files it came
from, whether it is valid (and its errors), and each value with the file and key it
came from.
"""

from __future__ import annotations

import json

from rdmad.ctl.render.formats import printable, table

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from typing import Any


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
