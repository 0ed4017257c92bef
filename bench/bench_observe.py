"""Median/p99 of observe_host(Path('/')) and KernelHost.observe() on this machine.

    .venv/bin/python bench/bench_observe.py [-n 200]

observe_host() pays for a new event loop and new netlink sockets each call (the
CLI's cost); KernelHost.observe() reuses its sockets (the daemon's per-pass cost).
Target: median < 50 ms. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rdmad.kernel.host import KernelHost
from rdmad.kernel.oneshot import observe_host

TARGET_MS = 50.0


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"median_ms": statistics.median(ms), "p99_ms": p99, "max_ms": ms[-1], "n": len(ms)}


def time_sync(fn: Callable[[], object], n: int) -> list[float]:
    fn()  # warm: imports, first socket
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


async def time_host(n: int) -> list[float]:
    async with KernelHost("/") as host:
        await host.observe()
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await host.observe()
            out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="runs per measurement")
    args = parser.parse_args()
    results = {
        "observe_host('/')": summary(time_sync(lambda: observe_host(Path("/")), args.n)),
        "KernelHost.observe()": summary(asyncio.run(time_host(args.n))),
    }
    print(f"{'what':<24} {'n':>5} {'median ms':>10} {'p99 ms':>9} {'max ms':>9}")
    for name, r in results.items():
        print(
            f"{name:<24} {r['n']:>5.0f} {r['median_ms']:>10.2f} {r['p99_ms']:>9.2f} "
            f"{r['max_ms']:>9.2f}"
        )
    ok = all(r["median_ms"] < TARGET_MS for r in results.values())
    print(json.dumps({"bench": "observe", "target_median_ms": TARGET_MS, "ok": ok, **results}))


if __name__ == "__main__":
    main()
