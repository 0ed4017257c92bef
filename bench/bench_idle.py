"""What an idle daemon costs: CPU and RSS of ``rdmad run`` over a window, vs do-nothing
processes measured over the same window.

    .venv/bin/python bench/bench_idle.py [--window 60] [--quick]

``rdmad run`` with an empty config (this host's kernel, read only; state and API
socket in a temp dir; its event sources and drift timer live; the unit's
``Environment=`` applied, rich hidden as in bench_start) is started, and once
it sent READY=1 (NOTIFY_SOCKET played here) and its API answers (the web library,
imported in a thread that may still run after READY=1 on a slow host, is part of what
idles, and its import is not), three processes are sampled over the same window: the
daemon, ``sleep infinity`` (what "nothing" costs) and a bare ``python3 -c 'import time;
time.sleep(1e9)'`` (the interpreter's own floor).
CPU = utime + stime from /proc/PID/stat over the window; RSS and peak RSS at its end.
``--quick``: a 5 s window. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_start import RUN_RDMAD, Notify, stop  # noqa: E402
from headline import emit, row  # noqa: E402

LAB = False
CLK_TCK = os.sysconf("SC_CLK_TCK")


def unit_environment(unit: Path = REPO / "systemd" / "rdmad.service") -> dict[str, str]:
    """The unit's Environment= assignments (glibc's malloc thresholds): what the daemon
    runs with on a node, and they change its RSS."""
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment=")):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> tuple[float, float]:
    kb = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            kb[line.split(":")[0]] = int(line.split()[1])
    return kb.get("VmRSS", 0) / 1024, kb.get("VmHWM", 0) / 1024


def wait_api(path: Path, timeout: float = 60.0) -> None:
    """Until GET /v1/status over the API socket is answered (a client waits in the
    socket's backlog while the daemon imports its web library)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: rdmad\r\nConnection: close\r\n\r\n")
        if not sock.recv(64).startswith(b"HTTP/1.1 "):
            raise RuntimeError("the API did not answer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds")
    ap.add_argument("--quick", action="store_true", help="a 5 s window (CI)")
    args = ap.parse_args()
    window = 5.0 if args.quick else args.window
    work = Path(tempfile.mkdtemp(prefix="rdmad-bench-idle-", dir="/tmp"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        etc = work / "etc"
        etc.mkdir()
        (etc / "rdmad.toml").write_text(
            f'[daemon]\nstate_dir = "{work / "state"}"\n\n[api]\nsocket = "{work / "rdmad.sock"}"\n'
        )
        notify = Notify(work / "notify.sock")
        env = dict(
            os.environ, **unit_environment(), NOTIFY_SOCKET=str(notify.path), PYTHONPATH=str(REPO)
        )
        argv = [
            sys.executable,
            "-c",
            RUN_RDMAD,
            "run",
            "--config",
            str(etc),
            "--log-level",
            "warning",
        ]
        procs["rdmad"] = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        notify.wait_ready()
        notify.close()
        wait_api(work / "rdmad.sock")
        procs["sleep infinity"] = subprocess.Popen(["sleep", "infinity"])
        procs["bare python sleeping"] = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(1e9)"]
        )
        time.sleep(1.0)  # past the daemon's startup settle window and the others' start
        start = {k: cpu_s(p.pid) for k, p in procs.items()}
        time.sleep(window)
        res = {}
        for k, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{k} exited ({p.returncode}) during the window")
            rss, peak = rss_mb(p.pid)
            res[k] = {
                "cpu_ms": (cpu_s(p.pid) - start[k]) * 1000,
                "rss_mb": rss,
                "peak_rss_mb": peak,
            }
    finally:
        for k, p in procs.items():
            if k == "rdmad":
                stop(p)
            else:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)

    print(f"window {window:g} s (CPU resolution {1000 / CLK_TCK:g} ms)")
    print(f"{'process':<24} {'CPU ms':>8} {'RSS MB':>8} {'peak MB':>8}")
    for k, r in res.items():
        print(f"{k:<24} {r['cpu_ms']:>8.0f} {r['rss_mb']:>8.1f} {r['peak_rss_mb']:>8.1f}")
    d, s, b = res["rdmad"], res["sleep infinity"], res["bare python sleeping"]
    headline = [
        row(f"idle CPU over {window:g} s", d["cpu_ms"], s["cpu_ms"], "sleep infinity"),
        row(f"idle CPU over {window:g} s", d["cpu_ms"], b["cpu_ms"], "bare python sleeping"),
        row("idle RSS", d["rss_mb"], s["rss_mb"], "sleep infinity", unit="MB"),
        row("idle RSS", d["rss_mb"], b["rss_mb"], "bare python sleeping", unit="MB"),
    ]
    emit("idle", headline, window_s=window, processes=res, environment=unit_environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
