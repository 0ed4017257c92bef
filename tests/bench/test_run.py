"""bench/run.py runs a real bench as a subprocess and writes the contract's JSON.

A real run of the cheapest host bench (bench_detail.py, --quick: pure code, well
under a second); the test checks the shape of what was written, never a number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"what", "rdmad", "baseline", "baseline_name", "unit", "ratio", "target", "met"}


def test_quick_run_of_one_host_bench_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--only", "detail", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["quick"] is True
    assert {"kernel", "nproc", "cpu", "commit"} <= doc["machine"].keys()
    assert list(doc["benches"]) == ["detail"]
    entry = doc["benches"]["detail"]
    assert (entry["status"], entry["lab"]) == ("ok", False)
    result = entry["result"]
    assert result["bench"] == "detail"
    assert result["headline"], "no headline rows"
    for row in result["headline"]:
        assert set(row) == ROW_KEYS
        assert isinstance(row["what"], str) and isinstance(row["rdmad"], float)
        assert row["baseline_name"] and isinstance(row["baseline"], float)
        assert abs(row["ratio"] - row["rdmad"] / row["baseline"]) <= 0.01 * row["ratio"] + 0.001
    # The combined table names the bench and each headline row.
    for row in result["headline"]:
        assert f"detail  {row['what']}" in proc.stdout


def test_unknown_bench_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--only", "nosuch", "--out", str(tmp_path / "r.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "no such bench: nosuch" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def run_lab_bench(
    tmp_path: Path, **required: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "RDMAD_TESTS_REQUIRED")}
    env.update(RDMAD_SKIP_LAB="1", **required)
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--only", "guard_lab", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, json.loads(out.read_text())["benches"]["guard_lab"]


def test_a_lab_bench_that_cannot_run_is_skipped_with_its_reason(tmp_path: Path) -> None:
    proc, entry = run_lab_bench(tmp_path, CI="false")
    assert proc.returncode == 0, proc.stderr
    assert (entry["lab"], entry["status"], entry["reason"]) == (True, "skipped", "RDMAD_SKIP_LAB=1")
    assert "guard_lab  skipped: RDMAD_SKIP_LAB=1" in proc.stdout


@pytest.mark.parametrize(
    "required", [{"CI": "true"}, {"CI": "1"}, {"RDMAD_TESTS_REQUIRED": "1"}], ids=str
)
def test_in_ci_a_lab_bench_that_cannot_run_is_an_error(
    tmp_path: Path, required: dict[str, str]
) -> None:
    proc, entry = run_lab_bench(tmp_path, **required)
    assert proc.returncode == 1
    assert (entry["status"], entry["reason"]) == ("error", "RDMAD_SKIP_LAB=1")
    assert "errors: guard_lab" in proc.stderr


def load_runner(monkeypatch: Any) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_runner", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


FAKE_LAB_BENCH = """
import json, sys
from pathlib import Path
runs = Path(sys.argv[0]).with_suffix(".runs")
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
if n <= {stops}:
    sys.exit(3)  # its guest stopped answering
print(json.dumps({{"bench": "fake", "headline": [], "run": n}}))
"""


def run_fake_lab_bench(tmp_path: Path, monkeypatch: Any, stops: int) -> Any:
    runner = load_runner(monkeypatch)
    monkeypatch.setattr(runner, "lab_unavailable", lambda: None)
    script = tmp_path / "bench_fake.py"
    script.write_text(FAKE_LAB_BENCH.format(stops=stops))
    monkeypatch.setattr(runner, "REPO", tmp_path)  # for the progress line's relative path
    bench = runner.Bench("fake", script, lab=True)
    runner.run_one(bench, quick=True, ci=True)
    return runner, bench


def test_a_lab_bench_whose_guest_stopped_runs_once_more(tmp_path: Path, monkeypatch: Any) -> None:
    runner, bench = run_fake_lab_bench(tmp_path, monkeypatch, stops=1)
    assert (bench.status, bench.result["run"]) == ("ok", 2)
    assert bench.reruns == ["its guest stopped answering or never booted (the reason is above)"]
    assert (
        "ran twice: the first time its guest stopped answering or never booted"
        in runner.combined([bench])
    )


def test_a_guest_that_stops_twice_is_an_error(tmp_path: Path, monkeypatch: Any) -> None:
    _, bench = run_fake_lab_bench(tmp_path, monkeypatch, stops=2)
    assert (bench.status, bench.reason) == (
        "error",
        "its guest stopped answering or never booted, twice",
    )
    assert (tmp_path / "bench_fake.runs").read_text() == "2"  # never a third time
