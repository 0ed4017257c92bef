"""rxe benchmark in the lab guest: netdev appears -> rxe link present, rdmad vs a udev rule.

    sudo .venv/bin/python bench/bench_rxe.py [--runs 30]

Boots one lab guest (QEMU/TCG, kernel 6.1; see tests/lab/README.md), installs
rdmad, and measures in the guest, with one clock for both (CLOCK_MONOTONIC of a
small poller running in the guest):

* rdmad: running under systemd with ``[[rxe]] name = "rxbench", netdev = { name =
  "benchv0" }`` (drift timer 1 h, so only events act);
* udev: rdmad stopped, ``/etc/udev/rules.d/90-rxe-bench.rules`` with
  ``ACTION=="add", SUBSYSTEM=="net", KERNEL=="benchv0",
  RUN+="/usr/bin/rdma link add rxbench type rxe netdev %k"`` — the usual
  hand-made alternative, reacting to the same event.

Each run: ``ip link add benchv0 type veth peer name benchp0`` is started, and the
poller (every 2 ms) notes when ``/sys/class/net/benchv0`` appears and when
``/sys/class/infiniband/rxbench`` appears; the latency is the difference. Then
the veth is deleted (its rxe link goes with it) and the node left idle for
``--gap`` seconds, so every run meets an idle rdmad (leading edge). rdma_rxe is
loaded beforehand in both modes. The first run of each mode is a warm-up and
is not counted. p99 of 30 samples is close to the maximum: read it as such.

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))

from harness import Guest, log, pool_or_exit  # noqa: E402

RXE = "rxbench"
NETDEV = "benchv0"
RULE = "/etc/udev/rules.d/90-rxe-bench.rules"
RULE_TEXT = (
    f'ACTION=="add", SUBSYSTEM=="net", KERNEL=="{NETDEV}", '
    f'RUN+="/usr/bin/rdma link add {RXE} type rxe netdev %k"\n'
)
CONFIG = f"""[daemon]
drift_interval = "1h"
settle = "150ms"

[[rxe]]
name = "{RXE}"
netdev = {{ name = "{NETDEV}" }}
"""

# Runs in the guest with its own python3 (stdlib only). Prints one JSON list.
GUEST_SCRIPT = r"""
import json, os, subprocess, sys, time
runs, gap, timeout = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
net, ib = "/sys/class/net/NETDEV", "/sys/class/infiniband/RXE"
out = []
for i in range(runs):
    subprocess.run(["ip", "link", "del", "NETDEV"], stderr=subprocess.DEVNULL)
    end = time.monotonic() + timeout
    while os.path.exists(ib) and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(gap)
    add = ["ip", "link", "add", "NETDEV", "type", "veth", "peer", "name", "benchp0"]
    proc = subprocess.Popen(add)
    t_net = t_ib = None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        now = time.monotonic()
        if t_net is None and os.path.exists(net):
            t_net = now
        if t_net is not None and os.path.exists(ib):
            t_ib = now
            break
        time.sleep(0.002)
    proc.wait(timeout=timeout)
    out.append(None if t_net is None or t_ib is None else t_ib - t_net)
subprocess.run(["ip", "link", "del", "NETDEV"], stderr=subprocess.DEVNULL)
print(json.dumps(out))
""".replace("NETDEV", NETDEV).replace("RXE", RXE)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def measure(g: Guest, runs: int, gap: float, timeout: float) -> dict[str, Any]:
    raw = g.json(
        f"python3 /tmp/bench_rxe_guest.py {runs + 1} {gap} {timeout}",
        timeout=(runs + 1) * (gap + timeout + 5) + 60,
    )
    samples = [s for s in raw[1:] if s is not None]  # first run: warm-up
    missed = sum(1 for s in raw[1:] if s is None)
    ms = [s * 1000 for s in samples]
    return {
        "runs": len(samples),
        "missed": missed,
        "p50_ms": pct(ms, 50) if ms else None,
        "p99_ms": pct(ms, 99) if ms else None,
        "mean_ms": statistics.fmean(ms) if ms else None,
        "max_ms": max(ms) if ms else None,
        "samples_ms": [round(v, 1) for v in ms],
    }


def run(g: Guest, runs: int, gap: float, timeout: float) -> dict[str, Any]:
    g.install_rdmad()
    g.check("cat > /tmp/bench_rxe_guest.py", stdin=GUEST_SCRIPT.encode())
    g.check("modprobe rdma_rxe")

    log("bench: rdmad mode")
    g.check("mkdir -p /etc/rdmad && cat > /etc/rdmad/rdmad.toml", stdin=CONFIG.encode())
    g.check("systemctl restart rdmad.service", timeout=300)
    rdmad = measure(g, runs, gap, timeout)
    state = g.json("cat /var/lib/rdmad/state.json")
    causes = sorted(
        {h["cause"] for h in state["history"] if h["obj"] == f"rxe {RXE}" and h["cause"]}
    )
    g.check("systemctl stop rdmad.service", timeout=360)

    log("bench: udev RUN+= rule mode")
    g.check(f"cat > {RULE} && udevadm control --reload", stdin=RULE_TEXT.encode())
    udev = measure(g, runs, gap, timeout)
    g.run(f"rm -f {RULE}; udevadm control --reload")

    ratio = None
    if rdmad["p50_ms"] and udev["p50_ms"]:
        ratio = {
            "p50": rdmad["p50_ms"] / udev["p50_ms"],
            "p99": rdmad["p99_ms"] / udev["p99_ms"],
        }
    return {
        "bench": "rxe",
        "what": "netdev appears -> rxe link present (guest CLOCK_MONOTONIC, TCG)",
        "rdmad": rdmad,
        "udev_rule": udev,
        "ratio_rdmad_over_udev": ratio,
        "rdmad_history_causes": causes,
        "gap_s": gap,
    }


def print_table(r: dict[str, Any]) -> None:
    print(f"{'netdev appears -> rxe present':<34} {'p50 ms':>9} {'p99 ms':>9} {'mean':>9} {'n':>4}")
    for label, key in (("rdmad (events)", "rdmad"), ("udev RUN+= rdma link add", "udev_rule")):
        m = r[key]
        if m["p50_ms"] is None:
            print(f"{label:<34} {'-':>9} {'-':>9} {'-':>9} {m['runs']:>4}  (missed {m['missed']})")
            continue
        print(
            f"{label:<34} {m['p50_ms']:>9.1f} {m['p99_ms']:>9.1f} {m['mean_ms']:>9.1f} "
            f"{m['runs']:>4}" + (f"  (missed {m['missed']})" if m["missed"] else "")
        )
    ratio = r["ratio_rdmad_over_udev"]
    if ratio is not None:
        print(f"{'ratio rdmad / udev rule':<34} {ratio['p50']:>9.2f} {ratio['p99']:>9.2f}")
    print(f"rdmad history causes for {RXE}: {', '.join(r['rdmad_history_causes'])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--gap", type=float, default=0.5, help="idle seconds before each run")
    ap.add_argument("--timeout", type=float, default=20.0, help="per-run deadline (s)")
    args = ap.parse_args()
    pool = pool_or_exit("bench_rxe")
    started = time.monotonic()
    try:
        result = run(pool.shared(), args.runs, args.gap, args.timeout)
    finally:
        pool.close()
    result["wall_s"] = round(time.monotonic() - started, 1)
    print_table(result)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
