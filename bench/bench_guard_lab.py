"""The guard's decision in the QEMU/TCG lab guest: bench_guard.py --lab's guest part alone.

    sudo .venv/bin/python bench/bench_guard_lab.py [-n 10] [--quick]

igb with 7 VFs, one held through vfio (the guard refuses: the whole walk), cold
starts of ``python -I -m rdmad.guard check igb`` interleaved with bare python, with
the installed package's interpreter. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "lab"))

from bench_guard import headline_rows, lab
from harness import lab_script_exit
from headline import emit

LAB = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10, help="cold starts per command")
    ap.add_argument("--quick", action="store_true", help="3 cold starts, one guest boot (CI)")
    args = ap.parse_args()
    guest = lab(3 if args.quick else args.n)
    result = {"guest": guest}
    print(f"{'command':<20} {'median ms':>10} {'p90 ms':>8}")
    for name, s in guest.items():
        print(f"{name:<20} {s['median_ms']:>10.1f} {s['p90_ms']:>8.1f}")
    emit("guard_lab", headline_rows(result), **result)
    return 0


if __name__ == "__main__":
    sys.exit(lab_script_exit(main))
