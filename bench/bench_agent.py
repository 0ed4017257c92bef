"""Agent benchmarks: event -> reconcile-start latency, idle cost, start -> READY.

    sudo .venv/bin/python bench/bench_agent.py [--idle 60] [--events 200]

* latency: the daemon's own wiring (rtnetlink link events -> agent -> KernelHost.observe
  on this host, empty config) with dummy links created and deleted by `ip link`;
  arrival = when the event is read from the netlink socket, start = when the
  pass begins. Two patterns: isolated events (idle loop, leading edge) and
  events at random gaps of 0-300 ms (many land in a settle window).
* idle: `rdmad run` as a subprocess, empty config: CPU time (utime+stime) and RSS
  over the idle period after READY.
* start -> READY: Popen to READY=1 on NOTIFY_SOCKET, empty config, 5 runs.

Prints a table and one JSON line. Needs root (creates dummy links) for latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rdmad import config  # noqa: E402
from rdmad.agent import Agent, AgentOptions  # noqa: E402
from rdmad.clock import SystemClock  # noqa: E402
from rdmad.triggers import Trigger, TriggerQueue  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# --- latency ----------------------------------------------------------------------------------


class ArrivalLog:
    def __init__(self) -> None:
        self.arrivals: list[float] = []


async def _link_source(stream: object, log: ArrivalLog) -> AsyncIterator[Trigger]:
    from rdmad.kernel.linkevents import LinkEventStream

    assert isinstance(stream, LinkEventStream)
    async for e in stream:
        if e.name and e.name.startswith("rdb"):
            now = time.monotonic()
            log.arrivals.append(now)
            yield Trigger("netlink", f"{e.kind} {e.name}", at=now)


class _Src:
    name = "rtnetlink"

    def __init__(self, gen: AsyncIterator[Trigger]) -> None:
        self.gen = gen

    def __aiter__(self) -> AsyncIterator[Trigger]:
        return self.gen


async def _ip(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()


async def latency(events: int, settle: float) -> dict[str, dict[str, float]]:
    from rdmad.kernel.host import KernelHost
    from rdmad.kernel.linkevents import LinkEventStream

    tmp = Path(tempfile.mkdtemp(prefix="rdmad-bench-"))
    (tmp / "rdmad.toml").write_text(f'[daemon]\nsettle = "{int(settle * 1000)}ms"\n')
    log = ArrivalLog()
    stream = LinkEventStream()
    host = KernelHost("/")
    clock = SystemClock()
    agent = Agent(
        host,
        lambda: config.load(tmp / "rdmad.toml"),
        clock=clock,
        queue=TriggerQueue(clock),
        sources=[_Src(_link_source(stream, log))],
        options=AgentOptions(),
    )
    run = asyncio.get_running_loop().create_task(agent.run())
    while not agent.ready:
        await asyncio.sleep(0.01)
    results: dict[str, dict[str, float]] = {}
    rng = random.Random(42)
    for pattern, gap in (("isolated (idle loop)", lambda: 0.4), ("random gaps 0-300 ms", None)):
        start_idx = len(log.arrivals)
        pass_idx = len(agent.passes)
        for i in range(events if gap is None else events // 3):
            name = f"rdb{i % 50}"
            await _ip("link", "add", name, "type", "veth", "peer", "name", "p" + name)
            await asyncio.sleep(gap() if gap else rng.uniform(0.0, 0.3))
            await _ip("link", "del", name)
            await asyncio.sleep(gap() if gap else rng.uniform(0.0, 0.3))
        await asyncio.sleep(settle + 0.5)
        starts = [p.started for p in list(agent.passes)[pass_idx:]]
        lat = []
        for a in log.arrivals[start_idx:]:
            after = [s for s in starts if s >= a]
            if after:
                lat.append((min(after) - a) * 1000)
        results[pattern] = {
            "events": len(lat),
            "passes": len(starts),
            "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99),
            "max_ms": max(lat),
        }
    agent.stop()
    await run
    stream.close()
    host.close()
    return results


# --- a daemon process ---------------------------------------------------------------------------


def _daemon(tmp: Path, sock_path: Path) -> subprocess.Popen[bytes]:
    cfg = tmp / "etc"
    cfg.mkdir(exist_ok=True)
    (cfg / "rdmad.toml").write_text(
        f'[daemon]\nstate_dir = "{tmp / "state"}"\n\n[api]\nsocket = "{tmp / "rdmad.sock"}"\n'
    )
    env = dict(os.environ, NOTIFY_SOCKET=str(sock_path))
    return subprocess.Popen(
        [sys.executable, "-m", "rdmad.cli", "run", "--config", str(cfg), "--log-level", "warning"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_ready(sock: socket.socket, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        if b"READY=1" in sock.recv(65536):
            return


def _cpu_rss(pid: int) -> tuple[float, float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Vm")}
    return cpu, kb.get("VmRSS", 0) / 1024, kb.get("VmHWM", 0) / 1024


def start_and_idle(idle: float, runs: int = 5) -> dict[str, float]:
    times = []
    out: dict[str, float] = {}
    for i in range(runs):
        tmp = Path(tempfile.mkdtemp(prefix="rdmad-bench-"))
        sp = tmp / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(sp))
        t0 = time.monotonic()
        proc = _daemon(tmp, sp)
        try:
            _wait_ready(sock)
            times.append(time.monotonic() - t0)
            if i == runs - 1 and idle > 0:
                cpu0, _, _ = _cpu_rss(proc.pid)
                time.sleep(idle)
                cpu1, rss, hwm = _cpu_rss(proc.pid)
                out.update(idle_s=idle, idle_cpu_s=cpu1 - cpu0, rss_mb=rss, peak_rss_mb=hwm)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            sock.close()
    out.update(ready_median_s=statistics.median(times), ready_max_s=max(times), ready_runs=runs)
    return out


def import_time() -> float:
    code = "import time; t=time.perf_counter(); import rdmad.daemon, rdmad.kernel.host, "
    code += "rdmad.kernel.udev; print(time.perf_counter()-t)"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    return float(res.stdout.strip() or "nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--events", type=int, default=150)
    ap.add_argument("--settle", type=float, default=0.15)
    args = ap.parse_args()
    result: dict[str, object] = {"settle_ms": args.settle * 1000}
    if os.geteuid() == 0:
        result["latency"] = asyncio.run(latency(args.events, args.settle))
    result["process"] = start_and_idle(args.idle)
    result["import_s"] = import_time()

    print(f"{'metric':<48} {'value':>12}  target")
    lat = result.get("latency", {})
    assert isinstance(lat, dict)
    target = f"p99 < {args.settle * 1000 + 20:.0f} ms"
    for pattern, r in lat.items():
        print(f"{'event->pass start p50, ' + pattern:<48} {r['p50_ms']:>9.1f} ms")
        print(f"{'event->pass start p99, ' + pattern:<48} {r['p99_ms']:>9.1f} ms  {target}")
        print(f"{'  events / passes, ' + pattern:<48} {r['events']:>5.0f} / {r['passes']:<5.0f}")
    p = result["process"]
    assert isinstance(p, dict)
    rows = [
        (
            f"idle CPU over {p.get('idle_s', 0):.0f} s",
            f"{p.get('idle_cpu_s', 0):.3f} s",
            "< 0.05 s",
        ),
        (
            "idle RSS (peak)",
            f"{p.get('rss_mb', 0):.1f} ({p.get('peak_rss_mb', 0):.1f}) MB",
            "< 40 MB",
        ),
        (f"start -> READY, median of {p['ready_runs']}", f"{p['ready_median_s']:.3f} s", "< 1 s"),
        ("start -> READY, max", f"{p['ready_max_s']:.3f} s", ""),
        ("import rdmad.daemon + kernel.host + udev", f"{result['import_s']:.3f} s", ""),
    ]
    for name, value, goal in rows:
        print(f"{name:<48} {value:>16}  {goal}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
