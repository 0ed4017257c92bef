"""VF restore cost on a real kernel: rdmad's in-process netlink vs. `ip link set` scripts.

    sudo .venv/bin/python bench/bench_vf_restore.py [--nsim-vfs 64] [--repeat 3]

Boots the lab guest (tests/lab/harness.py; QEMU/TCG, kernel 6.1) and, inside it, for
igb (7 VFs: the attributes igb accepts -- mac, vlan+qos, spoofchk, trust) and netdevsim
(N VFs, every attribute: mac, vlan+qos+proto, spoofchk, trust, link state, min/max
rate, query_rss) measures, each from freshly created VFs:

* kernel numvfs: the `sriov_numvfs` 0 -> N write alone (what no tool can avoid);
* ip per attribute: a shell script with one `ip link set PF vf I ATTR` per attribute
  (what os-net-config-style scripts run);
* ip per VF: one `ip link set PF vf I ...all attributes...` per VF;
* rdmad netlink: `RtNetlink.set_vf_settings` in process (one batched RTM_SETLINK),
  every attribute sent, none skipped as already right;
* rdmad restore: from numvfs 0, rdmad's own loop -- observe, plan, apply, until the
  plan is empty (numvfs write + VF settings + the re-observation that verifies it);
  overhead = that minus the kernel's numvfs time.

Times are medians of --repeat runs, by the guest's clock, python start-up and imports
excluded. TCG: absolute numbers are ~10-50x a real host; the ratios are the point.
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lab"))

from harness import Guest, log, pool_or_exit

NSIM_ID = 21
GUEST_ARGV = ["/opt/rdmad/venv/bin/python", "/tmp/bench_vf_restore.py"]

GUEST_SCRIPT = r"""
import asyncio, json, os, statistics, subprocess, sys, time
from rdmad.kernel.host import KernelHost
from rdmad.model import Desired, PlanState, VfChange
from rdmad.reconcile import plan

kind, dev_dir, netdev = sys.argv[1:4]
n, repeat = int(sys.argv[4]), int(sys.argv[5])
NUMVFS = dev_dir + "/sriov_numvfs"

def vf_attrs(i):
    a = {"mac": "02:00:00:00:%02x:%02x" % (0xb0 + i // 256, i % 256), "vlan": 10 + i % 4000,
         "qos": i % 8, "spoofchk": i % 2 == 0, "trust": i % 2 == 1}
    if kind == "nsim":
        a.update(vlan_proto="802.1ad" if i % 2 else "802.1Q",
                 link_state=("auto", "enable", "disable")[i % 3],
                 min_tx_rate=10, max_tx_rate=100 + i, query_rss=True)
    return a

def onoff(b):
    return "on" if b else "off"

def ip_pieces(i):
    a = vf_attrs(i)
    vlan = "vlan %d qos %d" % (a["vlan"], a["qos"])
    if "vlan_proto" in a:
        vlan += " proto " + a["vlan_proto"]
    out = ["mac " + a["mac"], vlan, "spoofchk " + onoff(a["spoofchk"]),
           "trust " + onoff(a["trust"])]
    if kind == "nsim":
        out += ["state " + a["link_state"],
                "min_tx_rate %d max_tx_rate %d" % (10, a["max_tx_rate"]), "query_rss on"]
    return out

def write(path, value):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)

def settle():
    subprocess.run(["udevadm", "settle", "--timeout=30"], check=False)

def fresh_vfs():
    write(NUMVFS, 0); settle()
    write(NUMVFS, n); settle()

def numvfs_time():
    write(NUMVFS, 0); settle()
    t0 = time.monotonic(); write(NUMVFS, n); t = time.monotonic() - t0
    settle()
    return t

def shell(per_vf):
    lines = []
    for i in range(n):
        pieces = ip_pieces(i)
        if per_vf:
            lines.append("ip link set dev %s vf %d %s" % (netdev, i, " ".join(pieces)))
        else:
            lines += ["ip link set dev %s vf %d %s" % (netdev, i, p) for p in pieces]
    script = "set -e\n" + "\n".join(lines) + "\n"
    fresh_vfs()
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", script], check=True)
    return time.monotonic() - t0, len(lines)

def desired():
    return Desired.model_validate({"sriov": [{"pf": {"name": netdev}, "numvfs": n,
        "vf": [dict(index=i, **vf_attrs(i)) for i in range(n)]}]})

async def netlink(host):
    fresh_vfs()
    obs = await host.observe()
    pf = next(p for p in obs.pfs if p.netdev == netdev)
    current = {v.index: v.settings for v in pf.vfs if v.settings is not None}
    changes = [VfChange(i, k, getattr(current[i], k), v)
               for i in range(n) for k, v in vf_attrs(i).items()]
    t0 = time.monotonic()
    results = await host.rtnl.set_vf_settings(netdev, changes, current)
    t = time.monotonic() - t0
    errors = [str(r.error) for r in results if r.error is not None]
    return t, len(changes), errors

async def restore(host, d):
    write(NUMVFS, 0); settle()
    t0 = time.monotonic()
    passes = 0
    for _ in range(200):
        passes += 1
        actions = [a for a in plan(d, await host.observe(), PlanState())]
        todo = [a for a in actions if a.changes_kernel]
        if not actions:
            return time.monotonic() - t0, passes, []
        for a in todo:
            r = await host.apply(a)
            if not r.ok:
                return time.monotonic() - t0, passes, [str(e) for e in r.errors]
        if not todo:
            await asyncio.sleep(0.01)  # Waiting: VFs not visible yet
    return time.monotonic() - t0, passes, ["did not converge in 200 passes"]

async def main():
    med = statistics.median
    out = {"kind": kind, "vfs": n}
    out["numvfs_s"] = med(numvfs_time() for _ in range(repeat))
    runs = [shell(False) for _ in range(repeat)]
    out["ip_per_attr_s"], out["ip_per_attr_calls"] = med(r[0] for r in runs), runs[0][1]
    runs = [shell(True) for _ in range(repeat)]
    out["ip_per_vf_s"], out["ip_per_vf_calls"] = med(r[0] for r in runs), runs[0][1]
    async with KernelHost("/") as host:
        runs = [await netlink(host) for _ in range(repeat)]
        out["netlink_s"], out["netlink_changes"] = med(r[0] for r in runs), runs[0][1]
        out["netlink_errors"] = runs[0][2]
        d = desired()
        runs = [await restore(host, d) for _ in range(repeat)]
        out["restore_s"], out["restore_passes"] = med(r[0] for r in runs), runs[0][1]
        out["restore_errors"] = runs[0][2]
    write(NUMVFS, 0)
    return out

print(json.dumps(asyncio.run(main())))
"""


def run_case(g: Guest, kind: str, dev_dir: str, netdev: str, n: int, repeat: int) -> dict[str, Any]:
    g.check("cat > /tmp/bench_vf_restore.py", stdin=GUEST_SCRIPT.encode())
    res = g.run(
        [*GUEST_ARGV, kind, dev_dir, netdev, str(n), str(repeat)],
        timeout=3600,
    )
    if not res.ok:
        raise SystemExit(f"bench script failed in the guest:\n{res.describe()}")
    data: dict[str, Any] = json.loads(res.out.strip().splitlines()[-1])
    return data


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'PF':<10}{'VFs':>5}{'numvfs':>9}{'ip/attr':>10}{'ip/VF':>9}{'rdmad nl':>10}"
        f"{'attr/nl':>9}{'VF/nl':>8}{'restore':>9}{'overhead':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['kind']:<10}{r['vfs']:>5}{r['numvfs_s']:>9.3f}{r['ip_per_attr_s']:>10.3f}"
            f"{r['ip_per_vf_s']:>9.3f}{r['netlink_s']:>10.3f}"
            f"{r['ip_per_attr_s'] / r['netlink_s']:>8.1f}x"
            f"{r['ip_per_vf_s'] / r['netlink_s']:>7.1f}x"
            f"{r['restore_s']:>9.3f}{r['restore_s'] - r['numvfs_s']:>10.3f}"
        )
    lines.append(
        "seconds, medians, guest clock (TCG). attr/nl, VF/nl: shell time / rdmad netlink time. "
        "overhead: rdmad restore from 0 VFs minus the kernel's numvfs write."
    )
    for r in rows:
        for key in ("netlink_errors", "restore_errors"):
            if r[key]:
                lines.append(f"{r['kind']} {key}: {r[key][:3]}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nsim-vfs", type=int, default=64, help="netdevsim VFs (max_vfs raised)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pool = pool_or_exit("bench_vf_restore")
    rows = []
    try:
        g = pool.shared()
        g.install_rdmad()
        pf = g.igb_pf()
        igb_netdev = g.pci_netdevs(pf)[0]
        log("igb: 7 VFs")
        rows.append(run_case(g, "igb", g.pci_path(pf), igb_netdev, 7, args.repeat))
        nsim = g.nsim_create(NSIM_ID, max_vfs=max(args.nsim_vfs, 4))
        log(f"netdevsim: {args.nsim_vfs} VFs")
        rows.append(
            run_case(
                g,
                "nsim",
                f"/sys/bus/netdevsim/devices/netdevsim{NSIM_ID}",
                nsim,
                args.nsim_vfs,
                args.repeat,
            )
        )
    finally:
        pool.close()
    print(table(rows))
    print(json.dumps({"bench": "vf_restore", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
