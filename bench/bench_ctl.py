"""`rdmad-ctl status` wall time against a fixture API, vs a bare `python3 -c pass`.

    .venv/bin/python bench/bench_ctl.py [-n 40] [--quick]

Each run is a new process, as an operator's is: interpreter start, imports, one
request over the UNIX socket to a stdlib HTTP server in this process answering the
tests' converged-node document, the table printed. Runs of the three commands are
interleaved so load on the machine hits all of them alike. Byte-code is compiled
once into a temp PYTHONPYCACHEPREFIX (an installed rdmad has its .pyc files).
Target: rdmad-ctl's median within 40 ms of bare python's. Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from headline import emit, row  # noqa: E402

LAB = False
FIXTURE = REPO / "tests" / "ctl" / "fixtures" / "status-converged.json"
TARGET_MS = 40.0


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = FIXTURE.read_bytes()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(self.body)


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return {"median_ms": statistics.median(ms), "p90_ms": p90, "n": len(ms)}


def run_once(argv: list[str], env: dict[str, str], want: int) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    took = time.perf_counter() - start
    if proc.returncode != want:
        sys.exit(f"{argv} exited {proc.returncode}, not {want}: {proc.stderr.decode()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="runs per command")
    parser.add_argument("--quick", action="store_true", help="3 runs per command (CI)")
    args = parser.parse_args()
    if args.quick:
        args.n = 3
    workdir = Path(tempfile.mkdtemp(prefix="bench-ctl-", dir="/tmp"))
    sock = str(workdir / "rdmad.sock")
    server = _Server(sock, _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "NO_COLOR")}
    env["PYTHONPYCACHEPREFIX"] = str(workdir / "pyc")
    env["PYTHONPATH"] = str(REPO)
    py = sys.executable
    entry = "import sys; from rdmad.ctl import main; sys.exit(main())"  # the console script
    commands = {
        "python3 -c pass": ([py, "-c", "pass"], 0),
        "rdmad-ctl status": ([py, "-c", entry, "--socket", sock, "status"], 0),
        "python -m rdmad.ctl status": ([py, "-m", "rdmad.ctl", "--socket", sock, "status"], 0),
    }
    try:
        for argv, want in commands.values():
            for _ in range(3):  # compile byte-code, warm the page cache
                run_once(argv, env, want)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.n):
            for name, (argv, want) in commands.items():
                samples[name].append(run_once(argv, env, want))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        shutil.rmtree(workdir, ignore_errors=True)
    results = {name: summary(s) for name, s in samples.items()}
    bare = results["python3 -c pass"]["median_ms"]
    print(f"{'what':<28} {'n':>4} {'median ms':>10} {'p90 ms':>8} {'+ vs bare':>10}")
    for name, r in results.items():
        r["over_bare_ms"] = r["median_ms"] - bare
        print(
            f"{name:<28} {r['n']:>4.0f} {r['median_ms']:>10.1f} {r['p90_ms']:>8.1f} "
            f"{r['over_bare_ms']:>+10.1f}"
        )
    over = results["rdmad-ctl status"]["over_bare_ms"]
    ctl = results["rdmad-ctl status"]
    headline = [
        row(
            "rdmad-ctl status, new process (median)",
            ctl["median_ms"],
            bare,
            "bare interpreter (python3 -c pass)",
            target=f"<= bare + {TARGET_MS:g} ms",
            met=over <= TARGET_MS,
        ),
        row(
            "rdmad-ctl status, new process (p90)",
            ctl["p90_ms"],
            results["python3 -c pass"]["p90_ms"],
            "bare interpreter (python3 -c pass)",
        ),
    ]
    emit("ctl", headline, target_over_bare_ms=TARGET_MS, **results)


if __name__ == "__main__":
    main()
