"""Status detail cost: describe() (per-VF, per-attribute status) beside plan() on one PF
with 64 VFs and 4 rxe links, every VF declaring the usual attributes.

    .venv/bin/python bench/bench_detail.py [--runs 500] [--quick]

Two nodes: converged (the steady state: every pass publishes status) and one where
every VF's MAC differs (a plan with 64 changes). For each: plan() alone, describe()
alone, describe() + to_json() of every object (what /v1/status serialises), and the
reporter's ``Describer`` given a new observation equal to the last (a node at rest).
Headline: the detail each pass publishes (describe + to_json, p50) and the reporter's
memo on a node at rest, as a ratio to plan() on the same node (the work a pass does
anyway). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from headline import emit, row  # noqa: E402

from rdmad.model import (  # noqa: E402
    Desired,
    ModulesObserved,
    NetdevObserved,
    Observed,
    PfObserved,
    PlanState,
    RdmaLinkObserved,
    VfObserved,
    VfSettings,
)
from rdmad.model.validation import validate  # noqa: E402
from rdmad.reconcile import plan  # noqa: E402
from rdmad.reconcile.detail import Describer, describe  # noqa: E402

LAB = False
PF = "0000:3b:00.0"
VFS = 64


def mac(i: int) -> str:
    return f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"


def node(drifted: bool) -> tuple[Desired, Observed]:
    vfs = [
        {
            "index": i,
            "mac": mac(i),
            "vlan": 100 + i,
            "spoofchk": True,
            "trust": False,
            "link_state": "auto",
            "max_tx_rate": 10000,
            "driver": "vfdrv",
        }
        for i in range(VFS)
    ]
    rxe = [{"name": f"rxe{i}", "netdev": {"name": f"eth{i}"}} for i in range(4)]
    desired = validate(
        Desired, {"sriov": [{"pf": {"pci": PF}, "numvfs": VFS, "vf": vfs}], "rxe": rxe}
    )
    observed_vfs = tuple(
        VfObserved(
            index=i,
            pci=f"0000:3b:{0x10 + i // 8:02x}.{i % 8}",
            driver="vfdrv",
            settings=VfSettings(
                mac="02:ff:00:00:00:00" if drifted else mac(i),
                vlan=100 + i,
                qos=0,
                vlan_proto="802.1Q",
                spoofchk=True,
                trust=False,
                link_state="auto",
                min_tx_rate=0,
                max_tx_rate=10000,
                query_rss=False,
            ),
        )
        for i in range(VFS)
    )
    pf = PfObserved(PF, "mlx5_core", "ens1f0", 5, None, None, VFS, VFS, vfs=observed_vfs)
    observed = Observed(
        netdevs=tuple(NetdevObserved(f"eth{i}", i + 2) for i in range(4)),
        pfs=(msgspec.structs.replace(pf),),
        rdma_links=tuple(RdmaLinkObserved(f"rxe{i}", "rxe", f"eth{i}") for i in range(4)),
        modules=ModulesObserved(frozenset({"rdma_rxe"})),
    )
    return desired, observed


def timed(fn: Callable[[], object], runs: int) -> dict[str, float]:
    fn()  # warm up
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples) * 1e3, 4),
        "p99_ms": round(samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))] * 1e3, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="20 runs (CI)")
    args = ap.parse_args()
    if args.quick:
        args.runs = 20
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, drifted in (("converged", False), ("64 MACs differ", True)):
        d, o = node(drifted)
        actions = plan(d, o, PlanState())

        def detail_json(d: Desired = d, o: Observed = o, a: list = actions) -> object:
            return {k: v.to_json() for k, v in describe(d, o, a).items()}

        # What the reporter runs: a new, equal observation of an unchanged node is
        # answered from the last result.
        memo = Describer()
        again = node(drifted)[1]
        memo(d, o, actions)

        results[name] = {
            "plan": timed(lambda d=d, o=o: plan(d, o, PlanState()), args.runs),
            "describe": timed(lambda d=d, o=o, a=actions: describe(d, o, a), args.runs),
            "describe+to_json": timed(detail_json, args.runs),
            "Describer, same node": timed(
                lambda d=d, o=again, m=memo, a=actions: m(d, o, a), args.runs
            ),
        }
    print(f"{'node (64 VFs, 4 rxe)':<22} {'step':<22} {'p50 ms':>9} {'p99 ms':>9}")
    for name, steps in results.items():
        for step, r in steps.items():
            print(f"{name:<22} {step:<22} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f}")
    headline = []
    for name, steps in results.items():
        base = steps["plan"]["p50_ms"]
        headline.append(
            row(
                f"status detail, {name} (describe+to_json p50)",
                steps["describe+to_json"]["p50_ms"],
                base,
                "plan() on the same node",
            )
        )
    conv = results["converged"]
    headline.append(
        row(
            "status detail, node at rest (Describer memo p50)",
            conv["Describer, same node"]["p50_ms"],
            conv["plan"]["p50_ms"],
            "plan() on the same node",
        )
    )
    emit("detail", headline, vfs=VFS, rxe=4, runs=args.runs, **results)


if __name__ == "__main__":
    main()
