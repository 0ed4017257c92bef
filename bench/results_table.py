"""Rewrites the table at the top of bench/RESULTS.md from bench/results.json.

    .venv/bin/python bench/results_table.py [--results PATH] [--md PATH]

`make bench` runs it after bench/run.py. The table has one row per headline of
``HEADLINES`` below: which row of a bench's JSON is its headline, and its target (the
table's targets live here and nowhere else). A bench that ran (status ``ok``) gets its
row from the JSON with the run's date and commit; a bench that did not run, was
skipped or failed keeps the row the table had. Only the text between the two marker
comments changes. A ``--quick`` run's JSON (`make bench-quick`, CI) is refused: its
figures are at the smallest sizes and are no results.

Standard library only; the row cells are formatted as bench/headline.py prints them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

START = "<!-- results-table:start (bench/results_table.py writes the rows; make bench) -->"
END = "<!-- results-table:end -->"
COLUMNS = (
    "bench",
    "headline",
    "rdmad",
    "baseline",
    "ratio",
    "target",
    "met",
    "date",
    "commit",
    "source",
)
SOURCE = "`make bench`"


@dataclass(frozen=True)
class Headline:
    """One row of the table: the bench's JSON row whose ``what`` starts with ``what``
    (and whose ``baseline_name`` is ``vs``, when given), and its target (None: none)."""

    label: str
    what: str
    target: str | None = None
    vs: str | None = None


# Every bench/bench_NAME.py, by NAME; a test checks that none is missing. The target is
# the same text the bench writes in its JSON row (which also says whether it was met);
# the script stops when the two differ.
HEADLINES: dict[str, tuple[Headline, ...]] = {
    "api": (
        Headline(
            "/v1/status handler, every object changed, p99",
            "/v1/status handler, every object changed",
            "< 5 ms",
        ),
    ),
    "ctl": (
        Headline(
            "`rdmad-ctl status`, new process, median",
            "rdmad-ctl status, new process (median)",
            "<= bare + 40 ms",
        ),
    ),
    "detail": (
        Headline(
            "status detail, 64 VFs converged (describe + to_json), p50",
            "status detail, converged (describe+to_json",
        ),
    ),
    "events": (
        Headline("event -> pass start, idle loop, p50", "event -> pass start, idle loop (p50)"),
        Headline(
            "burst of 1,000 links: passes run vs rule runs",
            "burst of",
            "<= 3 passes",
            vs="udev RUN+= rule: one run per net add uevent",
        ),
    ),
    "guard": (
        Headline(
            "guard decision, this host, median (cold start)",
            "guard decision, this host",
            "< 150 ms",
        ),
    ),
    "guard_lab": (
        Headline(
            "guard decision, TCG guest, igb 7 VFs one held, median",
            "guard decision, TCG guest",
        ),
    ),
    "guest_start": (
        Headline(
            "start -> READY in the guest, empty config, p50",
            "rdmad start -> READY, empty config (p50)",
        ),
    ),
    "idle": (Headline("idle RSS", "idle RSS", vs="bare python sleeping"),),
    "observe": (
        Headline("`KernelHost.observe()` on this host, p50", "observe() this host, daemon (p50)"),
        Headline("`observe()` growth, log-log slope", "observe() growth, log-log slope", "<= 1.15"),
    ),
    "peermem": (
        Headline(
            "`modprobe nvidia` -> nvidia_peermem loaded, p50",
            "nvidia loaded -> nvidia_peermem loaded (p50)",
            "< 1000 ms",
        ),
    ),
    "restore": (
        Headline("whole restore after a reboot, p50", "whole restore after reboot"),
        Headline("whole restore after an igb reload, p50", "whole restore after igb reload"),
    ),
    "rxe": (
        Headline(
            "netdev appears -> rxe present, p50",
            "netdev appears -> rxe present (p50,",
            "<= 0.5",
            vs="udev RUN+= rule",
        ),
        Headline(
            "`rdma link delete` -> rxe back, p50",
            "rdma link delete -> rxe back (p50,",
            "<= 0.5",
            vs="udev RUN+= rule",
        ),
    ),
    "start": (Headline("start -> READY, empty config, p50", "start -> READY, empty config (p50)"),),
    "vf_restore": (
        Headline(
            "VF restore, netdevsim 64 VFs, p50",
            "VF restore, nsim 64 VFs, VFs visible -> all set",
            "<= 1.3",
        ),
    ),
}


class TableError(Exception):
    """The table cannot be written (markers missing, a target that disagrees, ...)."""


def fmt(x: float | None) -> str:
    """A number as bench/headline.py prints it."""
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _with_unit(x: float | None, unit: str | None) -> str:
    return "-" if x is None else f"{fmt(x)} {unit}".rstrip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def pick(result: dict[str, Any], h: Headline) -> dict[str, Any] | None:
    """The JSON row ``h`` names among a bench's headline rows, or None."""
    for r in result.get("headline") or []:
        if str(r.get("what", "")).startswith(h.what) and h.vs in (None, r.get("baseline_name")):
            return dict(r)
    return None


def cells(bench: str, h: Headline, r: dict[str, Any], date: str, commit: str) -> list[str]:
    """A table row from one of the bench's JSON rows."""
    if r.get("target") != h.target:
        raise TableError(
            f"{bench}: {h.label!r}: the bench's target is {r.get('target')!r}, "
            f"bench/results_table.py's HEADLINES say {h.target!r}; make them agree, then "
            "run bench/results_table.py again (results.json is kept)"
        )
    ratio = r.get("ratio")
    baseline = _with_unit(r.get("baseline"), r.get("unit"))
    if r.get("baseline_name"):
        baseline = f"{baseline} ({r['baseline_name']})" if baseline != "-" else r["baseline_name"]
    met = {True: "yes", False: "**no**", None: "-"}[r.get("met")] if h.target else "-"
    return [
        bench,
        h.label,
        _with_unit(r.get("rdmad"), r.get("unit")),
        baseline,
        "-" if ratio is None else f"{fmt(ratio)}x",
        h.target or "none",
        met,
        date,
        commit,
        SOURCE,
    ]


def no_figure(bench: str, h: Headline) -> list[str]:
    return [bench, h.label, "no figure recorded", "-", "-", h.target or "none", "-", "-", "-", "-"]


def render(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


_SPLIT = re.compile(r"(?<!\\)\|")


def parse(table: str) -> dict[tuple[str, str], list[str]]:
    """The rows of a table ``render`` wrote, by (bench, headline)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for line in table.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        parts = [p.strip() for p in _SPLIT.split(line.strip("|"))]
        if len(parts) != len(COLUMNS) or parts[0] == COLUMNS[0]:
            continue
        parts = [p.replace("\\|", "|") for p in parts]
        rows[(parts[0], parts[1])] = parts
    return rows


def table(doc: dict[str, Any], previous: str, commit: str | None = None) -> str:
    """The table for results.json's ``doc``: rows of benches that ran from it, the
    others as ``previous`` (the table as it was) had them."""
    if doc.get("quick"):
        raise TableError("results.json is from a --quick run: its figures are no results")
    old = parse(previous)
    date = str(doc.get("date") or "")[:10] or "-"
    commit = (doc.get("machine") or {}).get("commit") or commit or "-"
    benches = doc.get("benches") or {}
    rows = []
    for bench, headlines in HEADLINES.items():
        entry = benches.get(bench) or {}
        result = entry.get("result") if entry.get("status") == "ok" else None
        for h in headlines:
            r = pick(result, h) if result else None
            if r is not None:
                rows.append(cells(bench, h, r, date, commit))
            else:
                rows.append(old.get((bench, h.label), no_figure(bench, h)))
    return render(rows)


def rewrite(markdown: str, doc: dict[str, Any], commit: str | None = None) -> str:
    """``markdown`` with the text between the markers replaced by the new table."""
    start, end = markdown.find(START), markdown.find(END)
    if start < 0 or end < start:
        raise TableError(f"the markers are missing:\n{START}\n{END}")
    inner = markdown[start + len(START) : end]
    return markdown[: start + len(START)] + "\n" + table(doc, inner, commit) + "\n" + markdown[end:]


def head_commit() -> str | None:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=BENCH / "results.json")
    ap.add_argument("--md", type=Path, default=BENCH / "RESULTS.md")
    args = ap.parse_args()
    try:
        doc = json.loads(args.results.read_text())
        text = rewrite(args.md.read_text(), doc, head_commit())
    except (OSError, json.JSONDecodeError, TableError) as exc:
        print(f"results_table: {exc}", file=sys.stderr)
        return 1
    args.md.write_text(text)
    print(f"written: {args.md} (the table, from {args.results})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
