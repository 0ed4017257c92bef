"""bench/results_table.py: results.json in, bench/RESULTS.md's table out; the rows of
benches that did not run are kept as they were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("results_table", REPO / "bench/results_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rt = _load()


def row(what: str, rdmad: float, baseline: float, name: str, unit: str = "ms", **kw: Any) -> Any:
    return {
        "what": what,
        "rdmad": rdmad,
        "baseline": baseline,
        "baseline_name": name,
        "unit": unit,
        "ratio": round(rdmad / baseline, 3),
        "target": kw.get("target"),
        "met": kw.get("met"),
    }


def doc(benches: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    return {
        "date": "2026-12-01T09:30:00+00:00",
        "quick": quick,
        "machine": {"commit": "abc1234"},
        "benches": benches,
    }


def ok(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "result": {"headline": list(rows)}}


API = row(
    "/v1/status handler, every object changed (p99)",
    1.2,
    2.4,
    "json.dumps of the same document",
    target="< 5 ms",
    met=True,
)
RXE_APPEAR = "netdev appears -> rxe present (p50, misses 0/0)"


def page(table: str) -> str:
    return f"# Results\n\nintro\n\n{rt.START}\n{table}\n{rt.END}\n\nafter\n"


def rows_of(markdown: str) -> dict[tuple[str, str], list[str]]:
    start, end = markdown.index(rt.START), markdown.index(rt.END)
    return rt.parse(markdown[start + len(rt.START) : end])  # type: ignore[no-any-return]


def test_a_bench_that_ran_gets_its_row_from_the_json() -> None:
    out = rows_of(rt.rewrite(page(""), doc({"api": ok(API)})))
    assert out[("api", "/v1/status handler, every object changed, p99")] == [
        "api",
        "/v1/status handler, every object changed, p99",
        "1.20 ms",
        "2.40 ms (json.dumps of the same document)",
        "0.5x",
        "< 5 ms",
        "yes",
        "2026-12-01",
        "abc1234",
        "`make bench`",
    ]


def test_every_headline_has_a_row_in_the_headlines_order() -> None:
    out = rows_of(rt.rewrite(page(""), doc({})))
    expected = [(b, h.label) for b, hs in rt.HEADLINES.items() for h in hs]
    assert list(out) == expected
    # Nothing recorded and nothing run: said, not invented.
    assert all(r[2] == "no figure recorded" for r in out.values())


def test_rows_of_benches_that_did_not_run_are_kept() -> None:
    first = rt.rewrite(page(""), doc({"api": ok(API)}))
    rxe = ok(
        row(RXE_APPEAR, 15.0, 30.0, "udev RUN+= rule", target="<= 0.5", met=True),
        row(RXE_APPEAR, 15.0, 7.5, "floor"),
    )
    second = doc({"api": {"status": "skipped", "result": None}, "rxe": rxe})
    second["date"], second["machine"]["commit"] = "2026-12-02T01:00:00+00:00", "def5678"
    out = rows_of(rt.rewrite(first, second))
    key = ("api", "/v1/status handler, every object changed, p99")
    assert out[key] == rows_of(first)[key]  # skipped: the old row, its date and commit
    appear = out[("rxe", "netdev appears -> rxe present, p50")]
    assert appear[3:9] == [
        "30.00 ms (udev RUN+= rule)",
        "0.5x",
        "<= 0.5",
        "yes",
        "2026-12-02",
        "def5678",
    ]


def test_hand_written_rows_survive_a_run_byte_for_byte() -> None:
    text = (REPO / "bench/RESULTS.md").read_text()
    again = rt.rewrite(text, doc({}))
    assert again == text


def test_only_the_text_between_the_markers_changes() -> None:
    out = rt.rewrite(page("| old |"), doc({"api": ok(API)}))
    assert out.startswith(f"# Results\n\nintro\n\n{rt.START}\n| bench |")
    assert out.endswith(f"\n{rt.END}\n\nafter\n")


def test_a_missed_target_is_marked_and_a_pipe_in_a_cell_escaped() -> None:
    slow = dict(API, met=False, baseline_name="a | b")
    out = rt.rewrite(page(""), doc({"api": ok(slow)}))
    assert "| **no** |" in out
    assert "(a \\| b)" in out
    key = ("api", "/v1/status handler, every object changed, p99")
    assert rows_of(out)[key][3] == "2.40 ms (a | b)"


def test_a_quick_run_is_refused() -> None:
    with pytest.raises(rt.TableError, match="quick"):
        rt.rewrite(page(""), doc({"api": ok(API)}, quick=True))


def test_a_target_that_differs_from_the_bench_is_an_error() -> None:
    with pytest.raises(rt.TableError, match="HEADLINES"):
        rt.rewrite(page(""), doc({"api": ok(dict(API, target="< 9 ms"))}))


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(rt.TableError, match="markers"):
        rt.rewrite("# no table here\n", doc({}))


def test_every_bench_has_its_headlines_and_every_headline_a_bench() -> None:
    benches = {p.stem.removeprefix("bench_") for p in (REPO / "bench").glob("bench_*.py")}
    assert set(rt.HEADLINES) == benches


def test_the_checked_in_table_has_a_row_for_every_headline() -> None:
    rows = rows_of((REPO / "bench/RESULTS.md").read_text())
    assert list(rows) == [(b, h.label) for b, hs in rt.HEADLINES.items() for h in hs]
