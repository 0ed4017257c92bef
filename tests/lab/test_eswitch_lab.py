"""[[sriov]] eswitch on kernel 6.1's netdevsim, with the .deb's unit: rdmad sets the mode
to switchdev before it makes the VFs (the history's order says so), the VF representors
appear and status names them; a hand-made switch back to legacy is undone by the event
it makes (no drift pass: the drift interval is an hour); a re-created device (the mode
is lost, as at boot) gets mode, VFs and VF settings back in that order. netdevsim has no
inline mode: the declared one is reported unsupported-by-driver, not retried.

netdevsim VFs are not PCI devices, so nothing can hold one: the block of a mode change
under VFs in use is proven by the unit and kernel tests (tests/unit/test_reconcile_eswitch.py,
tests/kernel/test_eswitch_host.py), not here. Their representors are real netdevs: one
in a bridge (as OVS takes them) and an rxe link on another block a mode change, named
in the status, until both are let go; then the mode changes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import Guest
from service import (
    DEBUG_LOG,
    applied,
    ctl,
    ctl_status,
    history,
    history_entries,
    start,
    status_text,
    wait_passes,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

NSIM_ID = 41
DEV = f"netdevsim/netdevsim{NSIM_ID}"
SYSDEV = f"/sys/bus/netdevsim/devices/netdevsim{NSIM_ID}"
MAC = "02:00:00:00:e5:00"


@pytest.fixture
def rdmad_guest(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    return guest


def config(netdev: str) -> str:
    return (
        '[daemon]\ndrift_interval = "1h"\n\n'
        f'[[sriov]]\npf = {{ name = "{netdev}" }}\nnumvfs = 2\n'
        'eswitch = { mode = "switchdev", inline_mode = "link" }\n\n'
        f'[[sriov.vf]]\nindex = 0\nmac = "{MAC}"\n'
    )


def mode(g: Guest) -> str:
    out = g.json(f"devlink -j dev eswitch show {DEV}")
    return str(out["dev"][DEV]["mode"])


def restored(g: Guest, netdev: str) -> None:
    g.wait_for(f"devlink dev eswitch show {DEV} | grep -q 'mode switchdev'", timeout=120)
    g.wait_for(f"[ $(cat {SYSDEV}/sriov_numvfs) = 2 ]", timeout=120)
    g.wait_for(f"ip link show {netdev} | grep -q 'vf 0 .*{MAC}'", timeout=120)


def order(g: Guest, modes: int, counts: int) -> list[str]:
    """This device's applied eSwitch mode and VF count writes, in history order, once
    there are ``modes`` of the one and ``counts`` of the other."""
    mode_write = f"netdevsim{NSIM_ID} eswitch mode"
    count_write = f"netdevsim{NSIM_ID} sriov_numvfs"
    history_entries(g, applied(mode_write), modes, 120)
    history_entries(g, applied(count_write), counts, 120)
    whats = [str(h["what"]) for h in history(g) if h["event"] == "applied"]
    return [w for w in whats if w.startswith((mode_write, count_write))]


def sriov_object(doc: dict[str, Any], netdev: str) -> dict[str, Any]:
    return next(o for o in doc["objects"] if o["obj"] == f"sriov name={netdev}")


def test_switchdev_before_the_vfs_kept_against_a_hand_change_and_a_recreated_device(
    rdmad_guest: Guest,
) -> None:
    g = rdmad_guest
    netdev = g.nsim_create(NSIM_ID)
    assert mode(g) == "legacy"  # the kernel's: as after every boot
    start(g, config(netdev))
    restored(g, netdev)
    assert order(g, 1, 1) == [
        f"netdevsim{NSIM_ID} eswitch mode: legacy -> switchdev",
        f"netdevsim{NSIM_ID} sriov_numvfs: 0 -> 2",
    ]
    # The representors of the two VFs (devlink's pcivf ports), named in status.
    # (6.1's iproute2 takes no device handle in `devlink port show`: all ports, filtered.)
    g.wait_for(
        f"[ $(devlink port show | grep '^{DEV}/' | grep -c 'flavour pcivf') = 2 ]", timeout=60
    )
    _, doc = ctl_status(g)
    obj = sriov_object(doc, netdev)
    assert obj["observed"]["eswitch"]["mode"] == "switchdev", obj
    reps = obj["observed"]["representors"]
    assert sorted(reps) == ["0", "1"] and all(reps.values()), obj
    attrs = {a["name"]: a for a in obj["attributes"]}
    assert attrs["eswitch.mode"]["state"] == "converged", attrs
    assert attrs["eswitch.inline_mode"]["state"] == "unsupported-by-driver", attrs
    assert obj["state"] == "unsupported-by-driver", obj
    table = ctl(g, "status", "--verbose").out
    assert f"{netdev}, eswitch switchdev, 2 of" in table, table
    assert f"(representor {reps['0']})" in table, table
    refused = [h for h in history(g) if "eswitch inline_mode" in str(h.get("what", ""))]
    assert len(refused) == 1, refused  # tried once, then remembered
    # The doctor reads the eSwitch over devlink itself (no daemon asked): the mode as
    # declared, the inline mode netdevsim lacks said once.
    doctor = ctl(g, "doctor", "--json")
    [check] = [c for c in json.loads(doctor.out)["checks"] if c["check"] == "eswitch"]
    assert check["status"] == "warn", check
    assert check["evidence"] == [
        f"pf name={netdev} (netdevsim{NSIM_ID}): mode switchdev",
        "  the driver reports no inline-mode: rdmad reports the declared link "
        "unsupported-by-driver",
    ], check

    # By hand, back to legacy: the representors go, and that event brings rdmad back.
    g.check(f"devlink dev eswitch set {DEV} mode legacy")
    history_entries(g, applied(f"netdevsim{NSIM_ID} eswitch mode: legacy -> switchdev"), 2, 120)
    g.wait_for(f"devlink dev eswitch show {DEV} | grep -q 'mode switchdev'", timeout=60)
    assert not any("drift" in str(h.get("cause")) for h in history(g) if h["event"] == "applied")

    # The device re-created: legacy, no VFs (as at boot); mode first again, then VFs.
    g.nsim_delete(NSIM_ID)
    g.wait_for(f"[ ! -e /sys/class/net/{netdev} ]", timeout=30)
    assert g.nsim_create(NSIM_ID) == netdev
    restored(g, netdev)
    assert order(g, 3, 2)[-2:] == [
        f"netdevsim{NSIM_ID} eswitch mode: legacy -> switchdev",
        f"netdevsim{NSIM_ID} sriov_numvfs: 0 -> 2",
    ]

    # With rdmad stopped, a hand change to legacy under the two VFs: the doctor says the
    # mode differs and lists the VFs a mode change would re-create.
    g.check("systemctl stop rdmad.service")
    g.check(f"devlink dev eswitch set {DEV} mode legacy")
    doctor = ctl(g, "doctor", "--json")
    [check] = [c for c in json.loads(doctor.out)["checks"] if c["check"] == "eswitch"]
    assert check["status"] == "warn", check
    assert check["evidence"][0] == (
        f"pf name={netdev} (netdevsim{NSIM_ID}): mode legacy; declared mode switchdev"
    ), check
    assert check["evidence"][2:] == [
        "  2 VF(s) exist: a mode change re-creates them, so rdmad makes it only while none "
        "is in use",
        f"  vf 0 (netdevsim{NSIM_ID} vf 0): no driver",
        f"  vf 1 (netdevsim{NSIM_ID} vf 1): no driver",
    ], check


def representors(g: Guest) -> dict[int, str]:
    """VF index -> representor netdev, as devlink's pcivf ports show them."""
    ports = g.json("devlink -j port show")["port"]
    return {
        int(p["vfnum"]): str(p["netdev"])
        for name, p in ports.items()
        if name.startswith(f"{DEV}/") and p.get("flavour") == "pcivf" and "netdev" in p
    }


def test_representors_in_use_block_a_mode_change_until_they_are_let_go(
    rdmad_guest: Guest,
) -> None:
    g = rdmad_guest
    netdev = g.nsim_create(NSIM_ID)
    # By hand: switchdev, two VFs; VF 0's representor in a bridge (as OVS takes it),
    # an rxe link on VF 1's.
    g.check(f"devlink dev eswitch set {DEV} mode switchdev")
    g.check(f"echo 2 > {SYSDEV}/sriov_numvfs")
    g.wait_for(
        f"[ $(devlink port show | grep '^{DEV}/' | grep -c 'flavour pcivf') = 2 ]", timeout=60
    )
    reps = representors(g)
    assert sorted(reps) == [0, 1], reps
    g.check(f"ip link add labbr0 type bridge && ip link set {reps[0]} master labbr0")
    g.check(f"modprobe rdma_rxe && rdma link add labrep1 type rxe netdev {reps[1]}")

    # Declared legacy: the mode change would destroy both representors.
    start(
        g,
        f'[daemon]\ndrift_interval = "2s"\n{DEBUG_LOG}\n\n'
        f'[[sriov]]\npf = {{ name = "{netdev}" }}\nnumvfs = 2\neswitch = {{ mode = "legacy" }}\n',
    )
    g.wait_for(
        "systemctl show -p StatusText --value rdmad | grep -q 'eSwitch mode change'", timeout=60
    )
    wait_passes(g, 2)  # rdmad's own record that it looked again and changed nothing
    assert mode(g) == "switchdev"
    assert representors(g) == reps
    _, doc = ctl_status(g)
    obj = json.dumps(sriov_object(doc, netdev))
    assert f"representor {reps[0]} is a port of labbr0" in obj, obj
    assert f"representor {reps[1]} carries rxe link labrep1" in obj, obj
    assert "eSwitch mode change" in status_text(g)
    assert not [h for h in history(g) if applied(f"netdevsim{NSIM_ID} eswitch mode")(h)]

    # The bridge lets go: still blocked by the rxe link.
    g.check(f"ip link set {reps[0]} nomaster")
    wait_passes(g, 2)
    assert mode(g) == "switchdev"
    _, doc = ctl_status(g)
    obj = json.dumps(sriov_object(doc, netdev))
    assert "labbr0" not in obj and "carries rxe link labrep1" in obj, obj

    # The rxe link goes too: now the mode changes, the VFs re-created under legacy.
    g.check("rdma link delete labrep1")
    history_entries(g, applied(f"netdevsim{NSIM_ID} eswitch mode: switchdev -> legacy"), 1, 120)
    g.wait_for(f"devlink dev eswitch show {DEV} | grep -q 'mode legacy'", timeout=60)
    assert representors(g) == {}
