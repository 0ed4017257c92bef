"""Whole restore in the lab guest after a reboot and a PF driver reload: rdmad vs a shell unit.

    sudo .venv/bin/python bench/bench_restore.py [--quick] [--repeat 3]

One lab guest (QEMU/TCG, kernel 6.1) with the emulated igb PF. What is restored: 4 VFs
(numvfs), each with mac, vlan+qos, spoofchk and trust (what igb accepts), and an rxe
link `rxr0` on the PF's netdev. Two modes, each with the other disabled:

* rdmad: the service enabled, its config declaring the above (`driver_guard = false`:
  the guard hook is the business of bench_guard, not of a restore);
* shell: what users run today, one script (numvfs write, one `ip link set PF vf I ...`
  per VF, `rdma link add`). After a reboot it runs as a `Type=oneshot` unit ordered
  after the PF's netdev device unit (`sys-subsystem-net-devices-PF.device`); a oneshot
  unit never runs again by itself, so after a driver reload the same script is started
  by a udev rule on the PF netdev's `add` event (`RUN+="systemd-run --no-block ..."`;
  `systemctl restart` of the oneshot unit fails there: its BindsTo= device is not
  active yet while udev still handles the event).

The clock is `guest_vf_poller.py` in the guest (CLOCK_MONOTONIC, a poll every 2 ms):

* driver reload: `modprobe -r igb; modprobe igb` while the poller runs; from the PF
  netdev appearing again under /sys/bus/pci/devices/PF/net (igb's probe) to every VF
  value and the rxe link visible;
* reboot: the poller runs as an early unit (DefaultDependencies=no, ordered before
  udev's coldplug), so it sees the PF netdev appear; from there to everything visible.
  The kernel's log stamp of igb's probe is reported beside it, and per boot when the PF
  appeared, when rdmad's process started and when it logged its first line (the
  interpreter and the imports done): if that line comes after the PF, the restore
  waited on rdmad's start-up, not on an event.

Medians over --repeat; ratio rdmad / shell. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LAB = True  # needs root and the lab image
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "lab"))

from harness import Guest, lab_script_exit, log, pool_or_exit  # noqa: E402

NUMVFS = 4
RXE = "rxr0"
LIB = "/usr/local/lib/rdmad-bench"
POLLER = f"{LIB}/guest_vf_poller.py"
BOOT_SPEC = "/etc/rdmad-bench-poll.json"
BOOT_OUT = "/var/tmp/rdmad-bench-boot.json"
SCRIPT = "/usr/local/sbin/lab-restore.sh"
UNIT = "lab-restore.service"
RULE = "/etc/udev/rules.d/90-lab-restore.rules"

# `--early`: rdmad ordered as early as its needs allow (config and state on local file
# systems, the journal's socket, udevd running), by a drop-in, to measure against the
# packaged ordering (not what the package ships). "rdmad-early" also orders it before
# udev's coldplug, so the PF's driver binds while rdmad already listens (the restore is
# its event path) and coldplug, with the rest of the boot, waits for its READY=1;
# "rdmad-parallel" starts it as early but beside coldplug.
EARLY_DROPIN = "/etc/systemd/system/rdmad.service.d/bench-early.conf"
EARLY_UNIT = """[Unit]
DefaultDependencies=no
After=local-fs.target systemd-journald.socket systemd-udevd.service systemd-tmpfiles-setup.service
Before=shutdown.target
Conflicts=shutdown.target
"""
EARLY = {
    "rdmad-early": EARLY_UNIT + "Before=systemd-udev-trigger.service\n",
    "rdmad-parallel": EARLY_UNIT,
}
# When the boot's milestones were reached (CLOCK_MONOTONIC, us), read after each reboot.
MILESTONES = ("rdmad.service", "systemd-udev-trigger.service", "multi-user.target")

POLL_UNIT = f"""[Unit]
Description=restore benchmark clock: PF, VFs, settings and rxe visible
DefaultDependencies=no
Before=systemd-udev-trigger.service sysinit.target

[Service]
Type=exec
ExecStart=/usr/bin/python3 {POLLER} {BOOT_SPEC} {BOOT_OUT}

[Install]
WantedBy=sysinit.target
"""

# Runs in the guest (python3, stdlib): a driver reload under the poller's clock.
RELOAD_DRIVER = rf"""
import json, os, subprocess, sys, time
spec, out = sys.argv[1], "/tmp/rdmad-bench-reload.json"
for p in (out, "/tmp/rdmad-bench-ready"):
    if os.path.exists(p):
        os.unlink(p)
proc = subprocess.Popen(["python3", "{POLLER}", spec, out])
end = time.monotonic() + 60
while not os.path.exists("/tmp/rdmad-bench-ready"):
    if time.monotonic() > end or proc.poll() is not None:
        raise SystemExit("poller did not start")
    time.sleep(0.01)
t0 = time.monotonic()
subprocess.run(["modprobe", "-r", "igb"], check=True, timeout=300)
t1 = time.monotonic()
subprocess.run(["modprobe", "igb"], check=True, timeout=300)
proc.wait(timeout=400)
res = json.load(open(out))
res.update(t_unload=t0, t_load=t1)
print(json.dumps(res))
"""


def declared() -> dict[int, dict[str, Any]]:
    return {
        i: {
            "mac": f"02:00:00:00:0c:{i:02x}",
            "vlan": 200 + i,
            "qos": 1 + i,
            "spoofchk": False,
            "trust": True,
        }
        for i in range(NUMVFS)
    }


def rdmad_config(pf: str) -> str:
    lines = [
        '[daemon]\ndrift_interval = "30s"\n',
        "[[rxe]]",
        f'name = "{RXE}"',
        f'netdev = {{ pci = "{pf}" }}',
        "",
        "[[sriov]]",
        f'pf = {{ pci = "{pf}" }}',
        f"numvfs = {NUMVFS}",
        "driver_guard = false",
    ]
    for i, attrs in declared().items():
        lines += ["", "[[sriov.vf]]", f"index = {i}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in attrs.items()]
    return "\n".join(lines) + "\n"


def shell_script(pf: str) -> str:
    lines = [
        "#!/bin/sh",
        "# Restore the PF's VFs, their settings and the rxe link (what rdmad declares).",
        "set -e",
        f"PF=$(ls /sys/bus/pci/devices/{pf}/net | head -n1)",
        f"echo 0 > /sys/bus/pci/devices/{pf}/sriov_numvfs",
        f"echo {NUMVFS} > /sys/bus/pci/devices/{pf}/sriov_numvfs",
    ]
    for i, a in declared().items():
        lines.append(
            f"ip link set dev $PF vf {i} mac {a['mac']} vlan {a['vlan']} qos {a['qos']} "
            f"spoofchk {'on' if a['spoofchk'] else 'off'} trust {'on' if a['trust'] else 'off'}"
        )
    lines.append(f"rdma link add {RXE} type rxe netdev $PF")
    return "\n".join(lines) + "\n"


def shell_unit(pf_netdev: str) -> str:
    dev = f"sys-subsystem-net-devices-{pf_netdev}.device"
    return (
        "[Unit]\nDescription=restore VFs and rxe (shell)\n"
        f"BindsTo={dev}\nAfter={dev}\n\n"
        f"[Service]\nType=oneshot\nExecStart={SCRIPT}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def udev_rule(pf: str) -> str:
    # The script in a transient unit of its own (udev kills long RUN programs). Not
    # `systemctl restart` of the oneshot unit: a RUN program runs before the device
    # unit is active, and the unit's BindsTo= fails as a dependency.
    return (
        f'ACTION=="add", SUBSYSTEM=="net", KERNELS=="{pf}", '
        f'RUN+="/usr/bin/systemd-run --no-block --collect --unit=lab-restore-udev {SCRIPT}"\n'
    )


def poll_spec(pf: str, timeout: float, ready: str | None) -> dict[str, Any]:
    return {
        "pci": pf,
        "numvfs": NUMVFS,
        "vfs": {str(i): v for i, v in declared().items()},
        "rxe": RXE,
        "timeout": timeout,
        "interval": 0.002,
        "ready": ready,
        "wait_gone": ready is not None,
    }


def journal_stamp(g: Guest, which: str, text: str) -> float | None:
    """The monotonic stamp (s since the kernel) of this boot's first journal line of
    ``which`` (journalctl's selection) that contains ``text``; None if there is none."""
    out = g.run(
        f"journalctl {which} -b -o short-monotonic --no-pager | grep -m1 -F '{text}'",
        timeout=120,
    ).out
    try:
        return float(out.split("]", 1)[0].strip("[ "))
    except ValueError:
        return None


def probe_stamp(g: Guest, pf: str) -> float | None:
    """The kernel's monotonic stamp of igb's first probe line for the PF in this boot."""
    return journal_stamp(g, "-k", f"igb {pf}")


def reboot_run(g: Guest, pf: str) -> dict[str, Any]:
    g.run(f"rm -f {BOOT_OUT}")
    g.reboot()
    g.wait_for(f"[ -s {BOOT_OUT} ]", timeout=400, interval=1.0)
    res: dict[str, Any] = g.json(f"cat {BOOT_OUT}")
    res["t_probe_log"] = probe_stamp(g, pf)
    g.wait_for("systemctl is-active -q multi-user.target", timeout=300, interval=1.0)
    for unit in MILESTONES:
        usec = g.check(f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").strip()
        res[f"t_{unit}"] = int(usec) / 1e6 if usec.isdigit() and int(usec) else None
    # When rdmad's process was started: from there to READY=1 is its start-up at boot.
    usec = g.check("systemctl show -p ExecMainStartTimestampMonotonic --value rdmad").strip()
    res["t_rdmad_exec"] = int(usec) / 1e6 if usec.isdigit() and int(usec) else None
    # Its first log line: the interpreter started and the daemon's imports done. Whether
    # that came before the PF appeared decides whether the restore is the event path.
    res["t_rdmad_log"] = journal_stamp(g, "-u rdmad.service", "event=daemon.start")
    return res


def reload_run(g: Guest) -> dict[str, Any]:
    res: dict[str, Any] = g.json(f"python3 {LIB}/reload.py {LIB}/reload-spec.json", timeout=900)
    return res


def check(res: dict[str, Any], what: str) -> float:
    if res.get("t_done") is None or res.get("t_pf") is None:
        raise SystemExit(f"{what}: not everything restored: {res.get('last')}")
    return (float(res["t_done"]) - float(res["t_pf"])) * 1000


def run_mode(g: Guest, mode: str, pf: str, pf_netdev: str, repeat: int) -> dict[str, Any]:
    if mode == "rdmad" or mode in EARLY:
        g.run(f"systemctl disable {UNIT}; rm -f {RULE}; udevadm control --reload", timeout=120)
        if mode in EARLY:
            g.check(
                f"mkdir -p {Path(EARLY_DROPIN).parent} && cat > {EARLY_DROPIN}",
                stdin=EARLY[mode].encode(),
            )
        else:
            g.run(f"rm -f {EARLY_DROPIN}")
        g.check(
            "mkdir -p /etc/rdmad && cat > /etc/rdmad/rdmad.toml", stdin=rdmad_config(pf).encode()
        )
        g.check("systemctl enable rdmad.service && systemctl restart rdmad.service", timeout=300)
    else:
        g.run(f"systemctl disable --now rdmad.service; rm -f {EARLY_DROPIN}", timeout=400)
        g.check(f"systemctl enable {UNIT}", timeout=120)
    out: dict[str, Any] = {"reboot": [], "reload": []}
    for r in range(repeat):
        log(f"{mode}: reboot {r + 1}/{repeat}")
        out["reboot"].append(reboot_run(g, pf))
    if mode == "shell":
        g.check(f"cat > {RULE} && udevadm control --reload", stdin=udev_rule(pf).encode())
    # After boot the ordering changes nothing: the early mode's reloads are rdmad's own.
    for r in range(repeat if mode not in EARLY else 0):
        log(f"{mode}: driver reload {r + 1}/{repeat}")
        out["reload"].append(reload_run(g))
    for kind in ("reboot", "reload") if mode not in EARLY else ("reboot",):
        ms = [check(x, f"{mode} {kind}") for x in out[kind]]
        out[f"{kind}_ms"] = statistics.median(ms)
        out[f"{kind}_samples_ms"] = [round(v, 1) for v in ms]
    probes = [
        (x["t_done"] - x["t_probe_log"]) * 1000 for x in out["reboot"] if x.get("t_probe_log")
    ]
    out["reboot_from_probe_log_ms"] = statistics.median(probes) if probes else None
    out["poller_before_pf"] = all(not x.get("pf_at_start") for x in out["reboot"])
    # Since the kernel started (CLOCK_MONOTONIC): when all was right, and the milestones.
    for key in ("t_done", "t_pf", "t_rdmad_exec", "t_rdmad_log", *(f"t_{u}" for u in MILESTONES)):
        got = [float(x[key]) for x in out["reboot"] if x.get(key) is not None]
        out[f"boot_{key}_s"] = round(statistics.median(got), 2) if got else None
    return out


def setup(g: Guest, pf: str, pf_netdev: str) -> None:
    g.install_rdmad()
    g.check(f"mkdir -p {LIB} && cat > {POLLER}", stdin=(HERE / "guest_vf_poller.py").read_bytes())
    g.check(f"cat > {LIB}/reload.py", stdin=RELOAD_DRIVER.encode())
    g.check(
        f"cat > {LIB}/reload-spec.json",
        stdin=json.dumps(poll_spec(pf, 300, "/tmp/rdmad-bench-ready")).encode(),
    )
    g.check(f"cat > {BOOT_SPEC}", stdin=json.dumps(poll_spec(pf, 300, None)).encode())
    g.check(f"cat > {SCRIPT} && chmod 0755 {SCRIPT}", stdin=shell_script(pf).encode())
    g.check(f"cat > /etc/systemd/system/{UNIT}", stdin=shell_unit(pf_netdev).encode())
    g.check(
        "cat > /etc/systemd/system/lab-bench-poll.service && systemctl daemon-reload && "
        "systemctl enable lab-bench-poll.service",
        stdin=POLL_UNIT.encode(),
    )


def table(res: dict[str, Any]) -> str:
    head = f"{'whole restore (ms, p50)':<34}{'rdmad':>10}{'shell':>10}{'ratio':>8}"
    lines = [head, "-" * len(head)]
    for kind, label in (
        ("reboot", "reboot: PF netdev -> all visible"),
        ("reload", "driver reload: PF -> all visible"),
    ):
        r, s = res["rdmad"][f"{kind}_ms"], res["shell"][f"{kind}_ms"]
        lines.append(f"{label:<34}{r:>10.0f}{s:>10.0f}{r / s:>7.2f}x")
    r, s = res["rdmad"]["reboot_from_probe_log_ms"], res["shell"]["reboot_from_probe_log_ms"]
    if r is not None and s is not None:
        lines.append(f"{'reboot: igb probe log -> all':<34}{r:>10.0f}{s:>10.0f}{r / s:>7.2f}x")
    for mode, label in (
        ("rdmad-early", "reboot, rdmad before coldplug"),
        ("rdmad-parallel", "reboot, rdmad early beside it"),
    ):
        if mode in res:
            e, s = res[mode]["reboot_ms"], res["shell"]["reboot_ms"]
            lines.append(f"{label:<34}{e:>10.0f}{s:>10.0f}{e / s:>7.2f}x")
    lines.append("")
    lines.append(
        f"{'after a reboot, s since the kernel':<34}"
        + "".join(f"{m:>14}" for m in res if res[m].get("boot_t_done_s") is not None)
    )
    for key, label in (
        ("boot_t_done_s", "all restored"),
        ("boot_t_pf_s", "PF netdev appeared"),
        ("boot_t_rdmad_exec_s", "rdmad started (exec)"),
        ("boot_t_rdmad_log_s", "rdmad's first log line"),
        ("boot_t_rdmad.service_s", "rdmad READY=1"),
        ("boot_t_systemd-udev-trigger.service_s", "coldplug done"),
        ("boot_t_multi-user.target_s", "multi-user.target"),
    ):
        vals = [res[m].get(key) for m in res if res[m].get("boot_t_done_s") is not None]
        lines.append(
            f"{label:<34}" + "".join(f"{v:>14.2f}" if v is not None else f"{'-':>14}" for v in vals)
        )
    lines.append(
        "guest CLOCK_MONOTONIC (TCG). shell: oneshot unit after the PF device at boot, "
        "the same script from a udev rule on reload."
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one reboot and one reload per mode")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--early",
        action="store_true",
        help="also rdmad ordered early: before udev's coldplug, and beside it (drop-ins; reboots)",
    )
    args = p.parse_args()
    repeat = 1 if args.quick else args.repeat
    pool = pool_or_exit("bench_restore")
    started = time.monotonic()
    res: dict[str, Any] = {}
    try:
        g = pool.shared()
        pf = g.igb_pf()
        pf_netdev = g.pci_netdevs(pf)[0]
        setup(g, pf, pf_netdev)
        kernel = g.check("uname -r").strip()
        for mode in ("rdmad", "shell", *(EARLY if args.early else ())):
            res[mode] = run_mode(g, mode, pf, pf_netdev, repeat)
    finally:
        pool.close()
    print(table(res))
    rows = []
    for kind, what in (
        ("reboot", "whole restore after reboot, PF netdev -> all visible (p50)"),
        ("reload", "whole restore after igb reload, PF netdev -> all visible (p50)"),
    ):
        r, s = res["rdmad"][f"{kind}_ms"], res["shell"][f"{kind}_ms"]
        rows.append(
            {
                "what": what,
                "rdmad": round(r, 1),
                "baseline": round(s, 1),
                "baseline_name": "oneshot unit"
                if kind == "reboot"
                else "the same script from a udev rule",
                "unit": "ms",
                "ratio": round(r / s, 2),
                "target": None,
                "met": None,
            }
        )
    print(
        json.dumps(
            {
                "bench": "restore",
                "headline": rows,
                "repeat": repeat,
                "guest_kernel": kernel,
                "vfs": NUMVFS,
                "rxe": RXE,
                "modes": res,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(lab_script_exit(main))
