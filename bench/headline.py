"""The benchmark contract's headline rows, shared by every bench/bench_*.py.

A bench prints its own table, then, as its LAST stdout line, one JSON object
``{"bench": NAME, "headline": [ROW, ...], ...detail...}``. A ROW compares rdmad with
the baseline a user would otherwise run, measured in the same run on the same clock:
``ratio`` = rdmad / baseline. A target is either on the ratio (``ratio_target``,
"<= 0.5") or stated outright with its verdict (``target`` + ``met``). A missed target
is data, never a failure: benches exit non-zero only on an error.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from typing import Any


def pct(values: list[float], p: float) -> float:
    """The p-th percentile by nearest rank (p99 of 30 samples is close to the maximum)."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio_spread(
    mine: list[float],
    base: list[float],
    p: float = 50,
    *,
    level: float = 0.9,
    rounds: int = 2000,
    seed: int = 1,
) -> tuple[float, float] | None:
    """How far the ratio of two p-th percentiles moves by sampling alone: each sample
    set drawn again from itself ``rounds`` times (a bootstrap; a fixed seed, so the same
    samples always give the same answer), and the central ``level`` of the ratios. For
    targets read from a few noisy samples (bench_rxe: 20 per mode), a run's ratio is
    one draw from about this range. None without samples on both sides."""
    if not mine or not base:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        b = pct(rng.choices(base, k=len(base)), p)
        if b > 0:
            ratios.append(pct(rng.choices(mine, k=len(mine)), p) / b)
    if not ratios:
        return None
    tail = (1 - level) / 2 * 100
    return pct(ratios, tail), pct(ratios, 100 - tail)


def _num(x: float | None, digits: int = 4) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return round(x, digits)


def row(
    what: str,
    rdmad: float | None,
    baseline: float | None = None,
    baseline_name: str | None = None,
    unit: str = "ms",
    *,
    ratio_target: float | None = None,
    target: str | None = None,
    met: bool | None = None,
) -> dict[str, Any]:
    """One headline row; ``ratio_target`` decides ``met`` from the ratio (<=)."""
    ratio = None
    if rdmad is not None and baseline:
        ratio = rdmad / baseline
    if ratio_target is not None:
        target = f"<= {ratio_target:g}"
        met = None if ratio is None else ratio <= ratio_target
    return {
        "what": what,
        "rdmad": _num(rdmad),
        "baseline": _num(baseline),
        "baseline_name": baseline_name if baseline is not None else None,
        "unit": unit,
        "ratio": _num(ratio, 3),
        "target": target,
        "met": met if target is not None else None,
    }


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


HEAD = ["what", "rdmad", "baseline", "unit", "ratio", "target", "met", "vs"]


def cells(r: dict[str, Any]) -> list[str]:
    """One headline row as table cells, in the order of HEAD."""
    met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
    ratio = r.get("ratio")
    return [
        r["what"],
        fmt(r.get("rdmad")),
        fmt(r.get("baseline")),
        r.get("unit") or "",
        fmt(ratio) + ("x" if ratio is not None else ""),
        r.get("target") or "-",
        met,
        r.get("baseline_name") or "",
    ]


def table(rows: list[dict[str, Any]]) -> str:
    """Headline rows as a fixed-width table."""
    return render([HEAD, *(cells(r) for r in rows)])


def render(cells: list[list[str]]) -> str:
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    out = []
    for c in cells:
        parts = [
            c[i].rjust(widths[i])
            if 0 < i < len(c) - 1 and _numeric(c[i])
            else c[i].ljust(widths[i])
            for i in range(len(c))
        ]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def _numeric(cell: str) -> bool:
    return cell[:1].isdigit() or (cell[:1] in "-+" and cell[1:2].isdigit())


def emit(bench: str, headline: list[dict[str, Any]], /, **detail: Any) -> None:
    """Print the headline table, then the one JSON line the runner reads (last)."""
    print(table(headline))
    print(json.dumps({**detail, "bench": bench, "headline": headline}, default=str))
