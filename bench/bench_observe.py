"""observe() cost: on this machine, and over fake trees as the node grows (1 .. 1024 VFs).

    .venv/bin/python bench/bench_observe.py [-n 50] [--quick]

* this host: ``KernelHost.observe()`` (the daemon's per-pass read: sysfs, rtnetlink,
  RDMA netlink over kept sockets) and ``observe_host('/')`` (the CLI's: new loop and
  sockets each call) vs ``ip -d -j link show`` + ``rdma -j link show``, what a shell
  unit runs to read the same state (two processes).
* fake trees (tests/support/fakesysfs.py): one PF with N VFs, each VF with its
  netdev, N = 1, 8, 64, 256, 1024 (``--quick``: 1, 8, 64). ``observe()`` from sysfs
  vs the floor: one walk of the same tree reading every file once (os.walk + read),
  the least any reader of that tree pays. Per VF cost, the growth between successive
  sizes and the log-log slope over the largest sizes say whether the cost is linear
  (slope ~1) or worse.

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from headline import emit, median, pct, row  # noqa: E402

from rdmad.kernel.apply.host import KernelHost  # noqa: E402
from rdmad.kernel.apply.observe import observe  # noqa: E402
from rdmad.kernel.apply.oneshot import observe_host  # noqa: E402
from rdmad.kernel.sysfs import Sysfs  # noqa: E402
from tests.support.fakesysfs import FakeSysfs  # noqa: E402

LAB = False
PF = "0000:3b:00.0"
SIZES = (1, 8, 64, 256, 1024)
QUICK_SIZES = (1, 8, 64)


def samples(fn: Callable[[], object], n: int) -> list[float]:
    fn()  # warm: imports, first socket, page cache
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def stats(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": median(ms), "p99_ms": pct(ms, 99), "n": len(ms)}


async def kernelhost(n: int) -> list[float]:
    async with KernelHost("/") as host:
        await host.observe()
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await host.observe()
            out.append((time.perf_counter() - start) * 1000)
    return out


def shell_read() -> None:
    for argv in (["ip", "-d", "-j", "link", "show"], ["rdma", "-j", "link", "show"]):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def this_host(n: int) -> dict[str, dict[str, float]]:
    return {
        "KernelHost.observe()": stats(asyncio.run(kernelhost(n))),
        "observe_host('/')": stats(samples(lambda: observe_host(Path("/")), n)),
        "ip -d -j link show + rdma -j link show": stats(samples(shell_read, n)),
    }


def build_tree(root: Path, vfs: int) -> None:
    fs = FakeSysfs(root)
    fs.driver_module("mlx5_core", "mlx5_core")
    fs.pf(PF, "mlx5_core", totalvfs=max(vfs, 1), numvfs=vfs)
    fs.netdev("ens1f0", PF, "52:54:00:00:00:01")
    for i in range(vfs):
        bdf = vf_bdf(i)
        fs.vf(PF, i, bdf, "mlx5_core", 100 + i)
        fs.netdev(f"ens1f0v{i}", bdf, f"02:00:00:00:{i // 256:02x}:{i % 256:02x}")


def vf_bdf(i: int) -> str:
    # 32 devices x 8 functions per bus: bus 3c.. for 1024 VFs
    bus, rest = divmod(i, 256)
    return f"0000:{0x3C + bus:02x}:{rest // 8:02x}.{rest % 8}"


def read_all(root: Path) -> int:
    """The floor: every file under the tree's sys/ read once, directories listed once."""
    total = 0
    for dirpath, _dirs, files in os.walk(root / "sys"):
        for f in files:
            try:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    total += len(fh.read())
            except OSError:
                pass
    return total


def fake_trees(sizes: tuple[int, ...], n: int) -> list[dict[str, Any]]:
    out = []
    for vfs in sizes:
        work = Path(tempfile.mkdtemp(prefix="bench-observe-"))
        try:
            build_tree(work, vfs)
            sysfs = Sysfs(work)
            got = observe(sysfs)
            assert len(got.pfs[0].vfs) == vfs, f"observe() saw {len(got.pfs[0].vfs)} of {vfs} VFs"
            runs = max(3, n if vfs <= 64 else n // 5)
            obs = samples(lambda s=sysfs: observe(s), runs)
            floor = samples(lambda w=work: read_all(w), runs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        out.append({"vfs": vfs, "observe": stats(obs), "floor": stats(floor)})
    return out


def growth(trees: list[dict[str, Any]]) -> dict[str, Any]:
    steps = []
    for a, b in itertools.pairwise(trees):
        t = b["observe"]["p50_ms"] / a["observe"]["p50_ms"]
        steps.append({"from": a["vfs"], "to": b["vfs"], "size_x": b["vfs"] / a["vfs"], "time_x": t})
    # Over the larger sizes, where the per-VF work outweighs the fixed part of a pass.
    a = next((t for t in trees if t["vfs"] >= 64 and t is not trees[-1]), trees[0])
    a = next((t for t in trees if t["vfs"] >= 8), a) if a is trees[0] else a
    b = trees[-1]
    slope = (
        math.log(b["observe"]["p50_ms"] / a["observe"]["p50_ms"]) / math.log(b["vfs"] / a["vfs"])
        if b["vfs"] > a["vfs"]
        else 0.0
    )
    return {"steps": steps, "slope": slope, "slope_over": [a["vfs"], b["vfs"]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=50, help="runs per measurement")
    ap.add_argument("--quick", action="store_true", help="5 runs, 1/8/64 VFs (CI)")
    args = ap.parse_args()
    n, sizes = (5, QUICK_SIZES) if args.quick else (args.n, SIZES)
    host = this_host(n)
    trees = fake_trees(sizes, n)
    grow = growth(trees)

    print(f"{'this host':<42} {'p50 ms':>9} {'p99 ms':>9} {'n':>5}")
    for name, s in host.items():
        print(f"{name:<42} {s['p50_ms']:>9.2f} {s['p99_ms']:>9.2f} {s['n']:>5}")
    print(
        f"\n{'fake tree':<10} {'observe ms':>11} {'per VF us':>10} {'floor ms':>9} {'x floor':>8}"
    )
    for t in trees:
        o, f = t["observe"]["p50_ms"], t["floor"]["p50_ms"]
        print(
            f"{t['vfs']:>4} VFs   {o:>15.2f} {o / t['vfs'] * 1000:>10.1f} {f:>9.2f} {o / f:>8.2f}"
        )
    for s in grow["steps"]:
        print(f"  {s['from']} -> {s['to']} VFs: size x{s['size_x']:g}, time x{s['time_x']:.2f}")
    shape = "linear or better" if grow["slope"] <= 1.15 else "WORSE than linear"
    print(
        f"log-log slope {grow['slope_over'][0]}..{grow['slope_over'][1]} VFs: "
        f"{grow['slope']:.2f} ({shape})"
    )

    kh = host["KernelHost.observe()"]["p50_ms"]
    sh = host["ip -d -j link show + rdma -j link show"]["p50_ms"]
    headline = [
        row("observe() this host, daemon (p50)", kh, sh, "ip -d link + rdma link (2 processes)"),
        row(
            "observe() this host, CLI (p50)",
            host["observe_host('/')"]["p50_ms"],
            sh,
            "ip -d link + rdma link (2 processes)",
        ),
    ]
    for t in trees:
        headline.append(
            row(
                f"observe() fake tree, {t['vfs']} VFs (p50)",
                t["observe"]["p50_ms"],
                t["floor"]["p50_ms"],
                "one walk+read of the tree (floor)",
            )
        )
    headline.append(
        row(
            f"observe() growth, log-log slope {grow['slope_over'][0]}..{grow['slope_over'][1]} VFs",
            grow["slope"],
            1.0,
            "linear",
            unit="exponent",
            ratio_target=1.15,
        )
    )
    emit("observe", headline, host=host, fake_trees=trees, growth=grow)
    return 0


if __name__ == "__main__":
    sys.exit(main())
