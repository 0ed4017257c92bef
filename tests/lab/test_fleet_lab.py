"""One config for a fleet, on the lab's 6.1 kernel with the .deb and its unit.

* ``FLEET``, one file, unchanged, on two nodes: one with the igb NIC and a netdevsim
  device, one booted without the igb (netdevsim only). PFs are chosen by what they are
  (the igb by PCI vendor, device and driver; netdevsim by driver), VF settings come in
  ranges with a VF's own block over its range, MACs are derived (from the PF's
  permanent MAC, from /etc/machine-id), and a selector no PF of the lab matches (a
  ConnectX's vendor ID) is converged with a note saying so. Both nodes converge; after
  a reboot each is restored: the igb's VFs by rdmad at boot, the netdevsim device (a
  reboot removes it) as soon as it is made again, with the same derived MACs.
* A systemd ``.link`` file with ``[SR-IOV]`` for the igb PF: rdmad holds the PF
  (blocked, naming the file; nothing written), the doctor warns; ``owner = "rdmad"``
  takes it over.

The expected MACs are computed here from the formula the docs give (rdmad.toml(5)),
not with rdmad's code; values are read back with `ip -d -j link show`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from daemon_proc import status_doc, wait_converged
from harness import Guest
from service import ctl, history, reload, start, write_config

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]

NSIM_ID = 31
IGB_VFS, NSIM_VFS = 4, 2
CONNECTX = "select:vendor=15b3"

FLEET = f"""\
[daemon]
drift_interval = "1h"

# The igb (82576) wherever a node has one; VFs 0-1 for one group, the rest another.
[[sriov]]
select = {{ vendor = "8086", device = "10c9", driver = "igb" }}
numvfs = {IGB_VFS}

[[sriov.vf]]
index = "0-1"
mac = {{ derive = "pf-mac" }}
vlan = 100
spoofchk = true

[[sriov.vf]]
index = "rest"
mac = {{ derive = "machine-id" }}
trust = true

[[sriov.vf]]
index = 0
vlan = 101

# Every netdevsim device (no PCI IDs, no permanent MAC: MACs from the machine-id).
[[sriov]]
select = {{ driver = "netdevsim" }}
numvfs = {NSIM_VFS}

[[sriov.vf]]
index = "rest"
mac = {{ derive = "machine-id" }}

# ConnectX PFs: none in the lab.
[[sriov]]
select = {{ vendor = "15b3" }}
numvfs = 8
"""


def derived(text: str) -> str:
    """rdmad.toml(5): the first 6 bytes of the SHA-256 of the text, the first byte's two
    low bits set to 10 (unicast, locally administered)."""
    raw = bytearray(hashlib.sha256(text.encode()).digest()[:6])
    raw[0] = (raw[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


def pf_mac_derived(perm: str, vf: int) -> str:
    return derived(f"rdmad-vf-mac pf-mac={perm} vf={vf}")


def machine_id_derived(machine_id: str, pf: str, vf: int) -> str:
    return derived(f"rdmad-vf-mac machine-id={machine_id} pf={pf} vf={vf}")


def vfs(g: Guest, netdev: str) -> dict[int, dict[str, Any]]:
    return {int(e["vf"]): e for e in g.vf_info(netdev)}


def vlan(entry: dict[str, Any]) -> int:
    return int((entry.get("vlan_list") or [{}])[0].get("vlan", 0))


def igb_want(perm: str, machine_id: str, pf: str) -> dict[int, dict[str, Any]]:
    """The igb's VFs as FLEET declares them: MAC, VLAN, and the flag each group sets."""
    return {
        0: {"address": pf_mac_derived(perm, 0), "vlan": 101, "spoofchk": True},
        1: {"address": pf_mac_derived(perm, 1), "vlan": 100, "spoofchk": True},
        2: {"address": machine_id_derived(machine_id, pf, 2), "vlan": 0, "trust": True},
        3: {"address": machine_id_derived(machine_id, pf, 3), "vlan": 0, "trust": True},
    }


def nsim_want(machine_id: str) -> dict[int, dict[str, Any]]:
    pf = f"netdevsim{NSIM_ID}"
    return {vf: {"address": machine_id_derived(machine_id, pf, vf)} for vf in range(NSIM_VFS)}


def shows(g: Guest, netdev: str, want: dict[int, dict[str, Any]]) -> bool:
    """The PF's VFs read back from the kernel are what FLEET makes of them."""
    try:
        have = vfs(g, netdev)
    except Exception:  # the PF's netdev is briefly away (a reload, a rename)
        return False
    for vf, values in want.items():
        entry = have.get(vf)
        if entry is None:
            return False
        for key, value in values.items():
            got = vlan(entry) if key == "vlan" else entry.get(key)
            if got != value:
                return False
    return True


def wait_shows(g: Guest, netdev: str, want: dict[int, dict[str, Any]], what: str) -> None:
    g.wait_until(lambda: shows(g, netdev, want), timeout=120, interval=0.5, what=what)


def objects(g: Guest) -> dict[str, dict[str, Any]]:
    return {o["obj"]: o for o in status_doc(g)["objects"]}


def assert_nothing_matches(doc: dict[str, dict[str, Any]], name: str, says: str) -> None:
    """A selector with no PF here: its own object, converged, saying why."""
    obj = doc[f"sriov {name}"]
    assert obj["state"] == "converged", obj
    assert "no PF matches" in json.dumps(obj) and says in json.dumps(obj), obj


def node_facts(g: Guest) -> str:
    machine_id = g.read("/etc/machine-id").strip()
    assert len(machine_id) == 32, machine_id  # a real one: derived MACs need it
    return machine_id


@pytest.mark.lab_needs("reboot")
def test_one_fleet_file_on_a_node_with_igb_and_netdevsim_restored_after_a_reboot(
    installed_guest: Guest,
) -> None:
    g = installed_guest
    assert g.install_rdmad().unit_installed
    g.run("rm -rf /etc/rdmad /var/lib/rdmad")
    machine_id = node_facts(g)
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]
    perm = g.read(f"/sys/class/net/{pf_netdev}/address").strip()  # never changed here
    nsim = g.nsim_create(NSIM_ID)
    igb, sim = igb_want(perm, machine_id, pf), nsim_want(machine_id)

    write_config(g, FLEET)
    g.check("systemctl enable rdmad.service && systemctl restart rdmad.service", timeout=300)
    wait_converged(g, 180)
    wait_shows(g, pf_netdev, igb, "the igb's VFs as FLEET makes them")
    wait_shows(g, nsim, sim, "the netdevsim VFs as FLEET makes them")
    assert g.numvfs(pf) == IGB_VFS
    doc = objects(g)
    assert doc[f"sriov pci={pf}"]["state"] == "converged", doc[f"sriov pci={pf}"]
    assert doc[f"sriov pci=netdevsim{NSIM_ID}"]["state"] == "converged"
    assert_nothing_matches(doc, CONNECTX, "15b3")
    # plan and status show the derived MACs as literals.
    assert pf_mac_derived(perm, 0) in json.dumps(doc[f"sriov pci={pf}"])

    g.reboot()
    # At boot: the igb restored by rdmad; the netdevsim device is gone until made again,
    # and its selector then matches nothing (converged, saying so).
    wait_converged(g, 240)
    pf_netdev = g.pci_netdevs(pf)[0]
    wait_shows(g, pf_netdev, igb, "the igb's VFs after the reboot")
    assert_nothing_matches(objects(g), "select:driver=netdevsim", "netdevsim")
    assert g.nsim_create(NSIM_ID) == nsim
    wait_shows(g, nsim, sim, "the netdevsim VFs made again after the reboot")
    wait_converged(g, 120)


@pytest.mark.lab_no_igb
@pytest.mark.lab_needs("boot", "reboot")
def test_the_same_file_on_a_node_with_netdevsim_only(installed_guest: Guest) -> None:
    g = installed_guest
    assert not g.run("ls -d /sys/bus/pci/drivers/igb/0000:* 2>/dev/null").out.strip()
    assert g.install_rdmad().unit_installed
    g.run("rm -rf /etc/rdmad /var/lib/rdmad")
    machine_id = node_facts(g)
    nsim = g.nsim_create(NSIM_ID)
    sim = nsim_want(machine_id)

    write_config(g, FLEET)
    g.check("systemctl enable rdmad.service && systemctl restart rdmad.service", timeout=300)
    wait_converged(g, 180)
    wait_shows(g, nsim, sim, "the netdevsim VFs as FLEET makes them")
    doc = objects(g)
    assert doc[f"sriov pci=netdevsim{NSIM_ID}"]["state"] == "converged"
    assert_nothing_matches(doc, "select:vendor=8086,device=10c9,driver=igb", "10c9")
    assert_nothing_matches(doc, CONNECTX, "15b3")

    g.reboot()
    wait_converged(g, 240)
    assert g.nsim_create(NSIM_ID) == nsim
    wait_shows(g, nsim, sim, "the netdevsim VFs made again after the reboot")
    wait_converged(g, 120)


LINK = "/etc/systemd/network/10-igb-sriov.link"
LINK_TEXT = """\
[Match]
Driver=igb

[Link]
NamePolicy=keep kernel database onboard slot path
MACAddressPolicy=persistent
SR-IOVVirtualFunctions=2

[SR-IOV]
VirtualFunction=0
Trust=yes
"""


def igb_config(pf: str, owner: bool) -> str:
    own = 'owner = "rdmad"\n' if owner else ""
    return (
        f'[daemon]\ndrift_interval = "1h"\n\n[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = 2\n{own}'
    )


def test_a_link_file_with_sriov_holds_the_pf_until_the_config_owns_it(guest: Guest) -> None:
    g = guest
    assert g.install_rdmad().unit_installed
    g.run("rm -rf /etc/rdmad /var/lib/rdmad")
    pf = g.igb_pf()
    obj = f"sriov pci={pf}"
    g.check(f"mkdir -p /etc/systemd/network && cat > {LINK}", stdin=LINK_TEXT.encode())

    start(g, igb_config(pf, owner=False))  # READY=1: the first pass is over
    doc = objects(g)[obj]
    assert doc["state"] == "blocked", doc
    reason = json.dumps(doc)
    assert "held" in reason and LINK in reason and 'owner = \\"rdmad\\"' in reason, doc
    assert g.numvfs(pf) == 0  # nothing written: the count stays the kernel's
    assert not [h for h in history(g) if h["event"] == "applied" and h["obj"] == obj]
    status = ctl(g, "status")
    assert status.rc == 1 and "held" in status.out, status.describe()  # not converged
    doctor = json.loads(ctl(g, "doctor", "--json").out)
    check = next(c for c in doctor["checks"] if c["check"] == "other-managers")
    assert check["status"] == "warn" and LINK in json.dumps(check), check

    reload(g, igb_config(pf, owner=True))
    wait_converged(g, 180)
    assert g.numvfs(pf) == 2
    taken = objects(g)[obj]
    assert taken["state"] == "converged" and "overrides" in json.dumps(taken), taken


DRIVER_SELECTOR = """\
[daemon]
drift_interval = "1h"

[[sriov]]
select = { driver = "igb" }
numvfs = 2
"""


def doctor_sriov(g: Guest) -> str:
    """What `rdmad-ctl doctor`'s sriov check says (its evidence), as one text."""
    doc = json.loads(ctl(g, "doctor", "--json").out)
    return json.dumps(next(c for c in doc["checks"] if c["check"] == "sriov"))


def test_a_pf_udev_has_not_processed_keeps_a_driver_selector_waiting(guest: Guest) -> None:
    """At boot, before coldplug reached it, a PF has no driver bound yet and udev has not
    processed it: a `driver` selector matched nothing, the node read converged, and a
    unit ordered after rdmad-wait-converged could start before its VFs (issue 61). Shown
    without a reboot: udevd's queue stopped, its database entry for the PF gone (as /run
    is at boot), igb unloaded. The PF waits, under the name it gets when it matches, and
    `rdmad-ctl wait` does not pass; once udev has processed the PF (its "unbind"), it
    is no longer waited for and the selector's note names it; once udev has processed
    its "add" (loading igb for it), rdmad restores its VFs."""
    g = guest
    assert g.install_rdmad().unit_installed
    g.run("rm -rf /etc/rdmad /var/lib/rdmad")
    pf = g.igb_pf()
    obj = f"sriov pci={pf}"
    start(g, DRIVER_SELECTOR)
    wait_converged(g, 180)
    assert g.numvfs(pf) == 2
    assert g.exists(f"/run/udev/data/+pci:{pf}")  # udev's entry for the PF, as rdmad reads it
    g.check("udevadm settle --timeout=60 && udevadm control --stop-exec-queue")
    try:
        # rtnetlink tells rdmad the netdevs went (udev's events wait in its queue).
        g.check(f"rm /run/udev/data/+pci:{pf} && modprobe -r igb", timeout=120)
        g.wait_until(
            lambda: objects(g).get(obj, {}).get("state") == "pending",
            timeout=120,
            interval=0.5,
            what=f"{obj} waiting for udev",
        )
        doc = objects(g)
        assert "udev has not processed it" in json.dumps(doc[obj]), doc[obj]
        selector = doc["sriov select:driver=igb"]
        assert selector["state"] == "converged" and f"{pf} may once" in json.dumps(selector)
        waited = ctl(g, "wait", "--within", "2")
        assert waited.rc == 1 and "not converged" in waited.err, waited.describe()
        said = doctor_sriov(g)  # the doctor reads udev's database as the daemon does
        assert f"{pf} has no driver bound yet and udev has not processed it" in said, said
        # udevd runs its queue: the PF's "unbind" writes its entry again, and no event
        # there loads igb. Processed, with no driver: nothing to wait for, and the
        # selector's note names the PF.
        g.check("udevadm control --start-exec-queue && udevadm settle --timeout=120")
        g.wait_until(
            lambda: obj not in objects(g),
            timeout=120,
            interval=0.5,
            what=f"{obj} no longer waiting once udev processed it",
        )
        note = objects(g)["sriov select:driver=igb"]
        assert note["state"] == "converged", note
        assert f"{pf} has no driver bound and may match once one is" in json.dumps(note), note
        said = doctor_sriov(g)
        assert f"{pf} has no driver bound and may match once one is" in said, said
        g.check(f"udevadm trigger --action=add /sys/bus/pci/devices/{pf}")
        g.check("udevadm settle --timeout=120")
        g.wait_until(lambda: g.numvfs(pf) == 2, timeout=120, interval=0.5, what="VFs restored")
        wait_converged(g, 120)
        assert objects(g)[obj]["state"] == "converged"
    finally:  # whatever failed, the guest's udevd runs its queue and igb is loaded
        g.run("udevadm control --start-exec-queue; modprobe igb")
