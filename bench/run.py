"""Runs every bench/bench_*.py, prints one table of their headline rows, writes JSON.

    .venv/bin/python bench/run.py [--quick] [--only NAME ...] [--out PATH]

Host benches (``LAB = False``) run first, then lab benches (``LAB = True``: root and
the QEMU lab image). Each bench is a subprocess; the runner reads its last stdout
line (the contract's JSON object, see bench/headline.py). A lab bench is skipped,
with the reason in the table, when not root, when RDMAD_SKIP_LAB=1, or when it
exits 2 (the lab cannot run) — except in CI (.ci/run, or any truthy CI), where that
is an error.
A lab bench whose guest stopped answering or never finished a boot (exit 3: the
emulator froze it, or a boot hung) runs once more on a new guest, and the table says
so. The run fails (exit 1) only when a bench errors or prints no JSON; never on a
number or a missed target.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from headline import HEAD, cells, render  # noqa: E402

# A bench that runs longer than this is stuck: a full lab bench boots guests under TCG.
TIMEOUT_S = {"quick": 1200, "full": 4 * 3600}


@dataclass
class Bench:
    name: str
    path: Path
    lab: bool | None  # None: not declared, an error
    status: str = "pending"  # ok | skipped | error
    reason: str = ""
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    reruns: list[str] = field(default_factory=list)  # why it ran more than once


def is_lab(path: Path) -> bool | None:
    """The module-level ``LAB = True/False`` (read, not imported: no lab imports here);
    None when the bench does not declare it."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "LAB" for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ):
            return bool(node.value.value)
    return None


def discover(only: list[str]) -> list[Bench]:
    found = {p.stem.removeprefix("bench_"): p for p in sorted(BENCH.glob("bench_*.py"))}
    unknown = [n for n in only if n.removeprefix("bench_") not in found]
    if unknown:
        raise SystemExit(f"no such bench: {', '.join(unknown)} (have: {', '.join(found)})")
    wanted = {n.removeprefix("bench_") for n in only} or set(found)
    benches = [Bench(n, p, is_lab(p)) for n, p in found.items() if n in wanted]
    return sorted(benches, key=lambda b: (b.lab is not False, b.name))  # host ones first


def required() -> bool:
    """A run where a lab bench that cannot run is an error, as a skipped test is a
    failure (tests/support/required.py): .ci/run's RDMAD_TESTS_REQUIRED=1, or any
    truthy CI (true, 1, yes)."""
    return any(
        os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")
        for name in ("RDMAD_TESTS_REQUIRED", "CI")
    )


def lab_unavailable() -> str | None:
    if os.environ.get("RDMAD_SKIP_LAB") == "1":
        return "RDMAD_SKIP_LAB=1"
    if os.geteuid() != 0:
        return "the lab needs root"
    return None


def last_json(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("headline"), list):
        return None
    return obj


def echo(proc: subprocess.Popen[str], out: list[str]) -> None:
    """The bench's stdout, kept and echoed as it comes (a full run is long)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        print(f"  {line}", end="", flush=True)


def stop_group(proc: subprocess.Popen[str]) -> int:
    """SIGTERM to the bench's process group (its cleanup runs), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


# A lab bench exits with this when its guest stopped answering (tests/lab/harness.py
# lab_script_exit): an emulator fault, so it runs once more on a new guest.
EXIT_GUEST_STOPPED = 3


def run_one(b: Bench, quick: bool, ci: bool) -> None:
    if b.lab is None:
        b.status, b.reason = "error", "no module-level LAB = True/False (the bench contract)"
        return
    if b.lab and (why := lab_unavailable()) is not None:
        b.status, b.reason = ("error" if ci else "skipped"), why
        return
    rc, timed_out, obj = attempt(b, quick)
    if b.lab and rc == EXIT_GUEST_STOPPED and not timed_out:
        b.reruns.append("its guest stopped answering or never booted (the reason is above)")
        print(f"== {b.name}: its guest stopped or never booted; running it once more", flush=True)
        rc, timed_out, obj = attempt(b, quick)
    limit = TIMEOUT_S["quick" if quick else "full"]
    if timed_out:
        b.status, b.reason = "error", f"still running after {limit} s: stopped"
    elif b.lab and rc == 2:
        b.status = "error" if ci else "skipped"
        b.reason = "the lab cannot run (exit 2; its reason is above)"
    elif b.lab and rc == EXIT_GUEST_STOPPED:
        b.status, b.reason = "error", "its guest stopped answering or never booted, twice"
    elif rc != 0:
        b.status, b.reason = "error", f"exit {rc}"
    elif obj is None:
        b.status, b.reason = "error", "no JSON object with a headline on its last line"
    else:
        b.status, b.result = "ok", obj


def attempt(b: Bench, quick: bool) -> tuple[int, bool, dict[str, Any] | None]:
    """One run of the bench: (exit code, stopped at the time limit, its JSON object)."""
    argv = [sys.executable, str(b.path), *(["--quick"] if quick else [])]
    print(f"== {b.name}: {b.path.relative_to(REPO)}{' --quick' if quick else ''}", flush=True)
    start = time.monotonic()
    # Its own process group, so a bench stuck past the bound goes with its children.
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    out: list[str] = []
    reader = threading.Thread(target=echo, args=(proc, out), daemon=True)
    reader.start()
    limit = TIMEOUT_S["quick" if quick else "full"]
    timed_out = False
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        rc = stop_group(proc)
    reader.join(30)
    b.seconds += time.monotonic() - start
    return rc, timed_out, last_json("".join(out))


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "commit": commit or None,
    }


def combined(benches: list[Bench]) -> str:
    """One table: every bench's headline rows, and a row for each skipped or failed one."""
    lines = [["bench", *HEAD]]
    for b in benches:
        if b.status == "ok":
            rows = b.result["headline"] or [{"what": "(no headline rows)"}]
            lines += [[b.name, *cells(r)] for r in rows]
            if b.reruns:
                note = f"ran twice: the first time {b.reruns[0]}"
                lines.append([b.name, note] + [""] * (len(HEAD) - 1))
        else:
            lines.append([b.name, f"{b.status}: {b.reason}"] + [""] * (len(HEAD) - 1))
    return render(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every bench once, smallest sizes")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="repeatable")
    ap.add_argument("--out", type=Path, default=BENCH / "results.json")
    args = ap.parse_args()
    ci = required()
    benches = discover(args.only)
    started = datetime.datetime.now(datetime.UTC)
    for b in benches:
        run_one(b, args.quick, ci)
    doc = {
        "date": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "benches": {
            b.name: {
                "lab": b.lab,
                "status": b.status,
                "reason": b.reason or None,
                "seconds": round(b.seconds, 1),
                "reruns": b.reruns,
                "result": b.result or None,
            }
            for b in benches
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print()
    print(combined(benches))
    print(f"\nwritten: {args.out}")
    errors = [b.name for b in benches if b.status == "error"]
    if errors:
        print(f"errors: {', '.join(errors)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
