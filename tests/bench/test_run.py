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
    tmp_path: Path, ci: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(RDMAD_SKIP_LAB="1", CI=ci)
    out = tmp_path / f"ci-{ci}.json"
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
    proc, entry = run_lab_bench(tmp_path, ci="false")
    assert proc.returncode == 0, proc.stderr
    assert (entry["lab"], entry["status"], entry["reason"]) == (True, "skipped", "RDMAD_SKIP_LAB=1")
    assert "guard_lab  skipped: RDMAD_SKIP_LAB=1" in proc.stdout


def test_in_ci_a_lab_bench_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    proc, entry = run_lab_bench(tmp_path, ci="true")
    assert proc.returncode == 1
    assert (entry["status"], entry["reason"]) == ("error", "RDMAD_SKIP_LAB=1")
    assert "errors: guard_lab" in proc.stderr
