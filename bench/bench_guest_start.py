"""rdmad in the lab guest: service start -> READY, and one observe() over 256 VFs.

    sudo .venv/bin/python bench/bench_guest_start.py [--quick] [--repeat 5]

One lab guest (QEMU/TCG, kernel 6.1), rdmad installed as the systemd service.

* start -> READY: `systemctl restart rdmad` (Type=notify), timed by systemd's own
  stamps, ExecMainStartTimestampMonotonic (the process forked) to
  ActiveEnterTimestampMonotonic (READY=1, sent after the first pass converged), for
  an empty config and for 4 igb VFs with mac/vlan/qos/spoofchk/trust + an rxe link
  on the PF (before each start: VFs and the rxe link removed, so the first pass
  creates them). Baseline: `python3 -c pass` in the same guest (the interpreter's
  floor), and beside it `import rdmad.cli` with rdmad's python (its imports).
* idle RSS: after each empty-config start, once `rdmad-ctl status` answers (the
  API's web library imported: the daemon as it idles), VmRSS of the unit's main
  process; baseline: a bare `python3` sleeping in the same guest.
* observe(): `KernelHost.observe()` in one process over a node with a netdevsim PF
  of 256 VFs (and igb, virtio-net), after one warm-up. Baseline: what an operator
  runs to see the same facts, `ip -d -j link show` + `rdma -j link show` + the
  `sriov_numvfs` of every PCI device, each a new process.

Medians over --repeat, guest clock. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LAB = True  # needs root and the lab image
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "lab"))

from harness import Guest, lab_script_exit, log, pool_or_exit, rdmad_python  # noqa: E402
from headline import emit, row  # noqa: E402

NSIM_ID = 23
NSIM_VFS = 256
RXE = "rxr0"

# python3 (stdlib): wall time of a command, repeated; prints a JSON list of seconds.
TIMER = r"""
import json, subprocess, sys, time
n, cmd = int(sys.argv[1]), sys.argv[2]
out = []
for _ in range(n):
    t = time.monotonic()
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
    out.append(time.monotonic() - t)
print(json.dumps(out))
"""

# rdmad's python: observe() over the node, after a warm-up; prints a JSON list of seconds.
OBSERVE = r"""
import asyncio, json, sys, time
from rdmad.kernel.apply.host import KernelHost
async def main(n):
    async with KernelHost("/") as host:
        obs = await host.observe()
        out = []
        for _ in range(n):
            t = time.monotonic()
            obs = await host.observe()
            out.append(time.monotonic() - t)
        vfs = sum(len(pf.vfs) for pf in obs.pfs)
        return {"seconds": out, "pfs": len(obs.pfs), "vfs": vfs}
print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
"""


PASS = "python3 -c pass"


def vf_config(pf: str) -> str:
    lines = [
        "[[rxe]]",
        f'name = "{RXE}"',
        f'netdev = {{ pci = "{pf}" }}',
        "",
        "[[sriov]]",
        f'pf = {{ pci = "{pf}" }}',
        "numvfs = 4",
    ]
    for i in range(4):
        lines += [
            "",
            "[[sriov.vf]]",
            f"index = {i}",
            f'mac = "02:00:00:00:0d:{i:02x}"',
            f"vlan = {300 + i}",
            f"qos = {i}",
            "spoofchk = false",
            "trust = true",
        ]
    return "\n".join(lines) + "\n"


def timed(g: Guest, n: int, cmd: str) -> list[float]:
    return [
        float(s)
        for s in g.json(f"python3 /tmp/bench_timer.py {n} {shlex.quote(cmd)}", timeout=60 + 120 * n)
    ]


def rss_mb(g: Guest, pid: int) -> float:
    line = g.check(f"grep VmRSS /proc/{pid}/status")  # "VmRSS:   45012 kB"
    return int(line.split()[1]) / 1024


def rdmad_rss(g: Guest) -> float:
    """The running daemon's RSS once its API answers (the web library imported: the
    whole daemon, as it idles)."""
    g.wait_for("rdmad-ctl --timeout 10 status >/dev/null", timeout=120)
    return rss_mb(g, int(g.check("systemctl show -p MainPID --value rdmad.service").strip()))


def bare_python_rss(g: Guest) -> float:
    pid = int(g.check("python3 -c 'import time; time.sleep(600)' >/dev/null 2>&1 & echo $!"))
    try:
        g.wait_for(f"grep -q 'State:.*S' /proc/{pid}/status", timeout=60)  # asleep: started
        return rss_mb(g, pid)
    finally:
        g.run(f"kill {pid}")


def start_ready(
    g: Guest, config: str, n: int, pf: str | None, rss: list[float] | None = None
) -> list[float]:
    g.check("mkdir -p /etc/rdmad && cat > /etc/rdmad/rdmad.toml", stdin=config.encode())
    out = []
    for _ in range(n):
        g.run("systemctl stop rdmad.service", timeout=400)
        if pf is not None:  # the first pass must create what is declared
            g.run(
                f"rdma link delete {RXE}; echo 0 > /sys/bus/pci/devices/{pf}/sriov_numvfs; "
                "udevadm settle --timeout=60",
                timeout=120,
            )
        g.check("systemctl start rdmad.service", timeout=300)
        stamps = g.check(
            "systemctl show -p ExecMainStartTimestampMonotonic "
            "-p ActiveEnterTimestampMonotonic --value rdmad.service"
        ).split()
        started, active = int(stamps[0]), int(stamps[1])
        out.append((active - started) / 1e6)
        if rss is not None:
            rss.append(rdmad_rss(g))
    g.run("systemctl stop rdmad.service", timeout=400)
    return out


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one run of each")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    n = 1 if args.quick else args.repeat
    pool = pool_or_exit("bench_guest_start")
    started = time.monotonic()
    r: dict[str, Any] = {}
    try:
        g = pool.shared()
        g.install_rdmad()
        kernel = g.check("uname -r").strip()
        g.check("cat > /tmp/bench_timer.py", stdin=TIMER.encode())
        g.check("cat > /tmp/bench_observe.py", stdin=OBSERVE.encode())
        pf = g.igb_pf()
        log("python3 -c pass; import rdmad.cli")
        r["python_pass"] = timed(g, n, "python3 -c pass")
        r["import_rdmad"] = timed(g, n, f"{rdmad_python()} -c 'import rdmad.cli'")
        log("start -> READY, empty config")
        r["rss_empty_mb"] = []
        r["ready_empty"] = start_ready(g, "", n, None, r["rss_empty_mb"])
        r["rss_bare_python_mb"] = [bare_python_rss(g) for _ in range(n)]
        log("start -> READY, 4 VFs + rxe")
        g.check("modprobe rdma_rxe")
        r["ready_vfs_rxe"] = start_ready(g, vf_config(pf), n, pf)
        g.run("rm -f /etc/rdmad/rdmad.toml")
        log(f"observe() over a netdevsim PF with {NSIM_VFS} VFs")
        g.nsim_create(NSIM_ID, NSIM_VFS, max_vfs=NSIM_VFS)
        obs = g.json(f"{rdmad_python()} /tmp/bench_observe.py {n}", timeout=600)
        r["observe"] = obs["seconds"]
        r["observe_pfs"], r["observe_vfs"] = obs["pfs"], obs["vfs"]
        r["ip_rdma_sysfs"] = timed(
            g,
            n,
            "ip -d -j link show; rdma -j link show; cat /sys/bus/pci/devices/*/sriov_numvfs "
            "/sys/bus/netdevsim/devices/*/sriov_numvfs 2>/dev/null; true",
        )
    finally:
        pool.close()
    base = ms(r["python_pass"])
    rss, bare = statistics.median(r["rss_empty_mb"]), statistics.median(r["rss_bare_python_mb"])
    headline = [
        row("rdmad start -> READY, empty config (p50)", ms(r["ready_empty"]), base, PASS),
        row("rdmad start -> READY, 4 VFs + rxe (p50)", ms(r["ready_vfs_rxe"]), base, PASS),
        row(
            f"observe(), netdevsim PF with {NSIM_VFS} VFs (p50)",
            ms(r["observe"]),
            ms(r["ip_rdma_sysfs"]),
            "ip -d -j link show + rdma link + sysfs numvfs",
        ),
        row("import rdmad.cli (rdmad python) (p50)", ms(r["import_rdmad"])),
        row(
            "idle RSS, empty config, API up (p50)",
            rss,
            bare,
            "bare python3 sleeping",
            unit="MB",
            target="<= 45 MB",  # #61, for the host's bench_idle; here beside it
            met=rss <= 45,
        ),
    ]
    print("guest clock (TCG); READY by systemd's monotonic stamps.")
    emit(
        "guest_start",
        headline,
        samples_s=r,
        repeat=n,
        guest_kernel=kernel,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(lab_script_exit(main))
