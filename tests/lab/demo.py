"""The end-to-end demo: rdmad restores SR-IOV VFs and an rxe link on a real kernel.

Boots a lab guest (QEMU/TCG, Debian 12, kernel 6.1, emulated igb NIC with
SR-IOV, no network), installs the .deb built from this tree with
`apt-get install ./rdmad_*.deb` (the service starts, managing nothing), declares
4 VFs with settings and an rxe link, then:

1. reloads rdmad and waits until the kernel shows the declaration;
2. reboots the guest and measures how long after the igb driver bound the
   VFs and the rxe link were back;
3. reloads the PF driver (`modprobe -r igb; modprobe igb`) and measures how
   long after the driver was back everything was restored.

Run as root: `python tests/lab/demo.py [--json]` (scripts/demo.sh does it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Guest, build_deb, install_mode, log, pool_or_exit
from service import write_config

NUMVFS = 4
RXE = "rxe0"


def vf_settings(index: int) -> dict[str, Any]:
    return {
        "mac": f"02:00:00:00:0a:{index:02x}",
        "vlan": 100 + index,
        "qos": index % 8,
        "spoofchk": index % 2 == 0,
        "trust": index % 2 == 1,
    }


def config_text(igb_pci: str, nic_pci: str) -> str:
    lines = [
        "[daemon]",
        'drift_interval = "1m"',
        "",
        "[[rxe]]",
        f'name = "{RXE}"',
        f'netdev = {{ pci = "{nic_pci}" }}   # the virtio NIC, whatever it is named',
        "",
        "[[sriov]]",
        f'pf = {{ pci = "{igb_pci}" }}',
        f"numvfs = {NUMVFS}",
    ]
    for i in range(NUMVFS):
        lines += ["", "[[sriov.vf]]", f"index = {i}"]
        for key, value in vf_settings(i).items():
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def restored_condition(pf_netdev: str) -> str:
    """A guest shell condition true once the kernel shows the whole declaration."""
    checks = [f"rdma link show {RXE}/1 >/dev/null 2>&1"]
    for i in range(NUMVFS):
        s = vf_settings(i)
        pattern = f"vf {i} .*link/ether {s['mac']}.*vlan {s['vlan']}"
        if s["qos"]:  # iproute2 prints ", qos N" only when it is not 0
            pattern += f", qos {s['qos']}"
        checks.append(f"ip link show {pf_netdev} | grep -q {shlex.quote(pattern)}")
    return " && ".join(checks)


def virtio_nic_pci(g: Guest) -> str:
    """PCI address of the guest's virtio NIC (the parent of its virtioN device)."""
    return g.check(
        "basename $(dirname $(readlink -f /sys/bus/virtio/drivers/virtio_net/virtio*))"
    ).strip()


def guest_now(g: Guest) -> float:
    return float(g.check("cat /proc/uptime").split()[0])


def kernel_ready_at(g: Guest, igb_pci: str) -> float:
    """Seconds since boot when the igb PF driver bound (its probe message)."""
    out = g.check(
        f"journalctl -k -b -o short-monotonic --no-pager | grep 'igb {igb_pci}:' | head -1"
    )
    return float(out.split("]")[0].strip("[ "))


def show(g: Guest, pf_netdev: str) -> str:
    return g.check(
        f"echo '$ rdma link show'; rdma link show; "
        f"echo '$ ip link show {pf_netdev} | grep vf'; ip link show {pf_netdev} | grep ' vf '; "
        "echo '$ rdmad-ctl status'; rdmad-ctl status || echo \"(rdmad-ctl status: exit $?)\"; "
        "echo '$ systemctl show -p StatusText rdmad'; systemctl show -p StatusText rdmad"
    )


def install(g: Guest) -> None:
    """The package, as a user installs it; RDMAD_LAB_INSTALL=source: the source copy."""
    if install_mode() == "source":
        g.install_rdmad()
        g.check("systemctl enable --now rdmad", timeout=180)
        return
    deb = build_deb()
    log(f"apt-get install ./{deb.name}  (the guest has no network: dependencies from the image)")
    res = g.install_deb(deb)
    if not res.ok:
        raise SystemExit(f"demo: apt-get install failed:\n{res.describe()}")
    log(
        "\n".join(ln for ln in res.out.splitlines() if not ln.startswith(("Reading", "Building")))
        + "\n"
        + g.check(
            "echo '$ systemctl is-enabled rdmad; systemctl is-active rdmad'; "
            "systemctl is-enabled rdmad; systemctl is-active rdmad; "
            "echo '$ systemctl show -p StatusText rdmad'; systemctl show -p StatusText rdmad"
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = p.parse_args()
    pool = pool_or_exit("demo")
    result: dict[str, Any] = {}
    g: Guest | None = None
    try:
        g = pool.shared(installed=False)  # installed below, as a user does
        install(g)
        igb_pci = g.igb_pf()
        pf_netdev = g.pci_netdevs(igb_pci)[0]
        nic_pci = virtio_nic_pci(g)
        cfg = config_text(igb_pci, nic_pci)
        log(f"declaring in /etc/rdmad/rdmad.toml:\n{cfg}")
        write_config(g, cfg)
        g.check("rdmad check-config")
        condition = restored_condition(pf_netdev)

        log("applying it: systemctl reload rdmad")
        t0 = time.monotonic()
        g.check("systemctl reload rdmad", timeout=180)
        g.wait_for(condition, timeout=120)
        result["reload_converged_s"] = round(time.monotonic() - t0, 2)
        log(
            f"converged {result['reload_converged_s']} s after `systemctl reload`\n"
            f"{show(g, pf_netdev)}"
        )

        g.reboot()
        g.wait_for(condition, timeout=180)
        restored_at = guest_now(g)
        ready = kernel_ready_at(g, igb_pci)
        result["reboot_restored_after_driver_s"] = round(restored_at - ready, 2)
        log(
            f"after reboot: restored within {result['reboot_restored_after_driver_s']} s of the "
            f"igb driver binding (an upper bound: measured when this check ran)\n"
            f"{show(g, pf_netdev)}"
        )

        log("reloading the PF driver: modprobe -r igb && modprobe igb")
        reload = g.check(
            "modprobe -r igb && modprobe igb && t0=$(cut -d' ' -f1 /proc/uptime) && "
            f"timeout 60 sh -c {shlex.quote(f'until {condition}; do sleep 0.05; done')} && "
            "t1=$(cut -d' ' -f1 /proc/uptime) && echo $t0 $t1",
            timeout=120,
        ).split()
        result["driver_reload_restored_s"] = round(float(reload[1]) - float(reload[0]), 2)
        log(
            f"after driver reload: restored {result['driver_reload_restored_s']} s after "
            f"`modprobe igb` returned\n{show(g, pf_netdev)}"
        )
        history = g.run("journalctl -u rdmad -b --no-pager -o cat | tail -n 15")
        log(f"rdmad's log since the reboot (tail):\n{history.out}")
    except Exception:
        if g is not None and g.alive():
            diag = g.run(
                "rdma link show; ip -d link show; systemctl status rdmad --no-pager; "
                "journalctl -u rdmad -b --no-pager -o cat | tail -n 60"
            )
            log(f"demo failed; the guest shows:\n{diag.out}{diag.err}")
        raise
    finally:
        pool.close()
    if args.json:
        print(json.dumps(result))
    else:
        print("\nrdmad lab demo: all restored")
        for key, value in result.items():
            print(f"  {key:<34} {value:>6} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
