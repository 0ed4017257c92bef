"""`rdmad snapshot` on a real kernel: set a node up by hand, snapshot it, reboot, same node.

In a fresh guest (it reboots): an rxe link on the virtio NIC, 4 igb VFs with
settings set by `ip`, VF 2 unbound from igbvf by hand, VF 3 handed to vfio-pci.
`rdmad snapshot -o /etc/rdmad/rdmad.d/50-snapshot.toml` writes it down (what igb
cannot set as comments, VF 2 as driver = "none"); `rdmad plan` shows the only
change the daemon would make (pinning VF 2 unbound through driver_override) and
which state it used; the service is enabled; after a reboot the VF settings, the
rxe link and every VF's driver binding are what they were, and `rdmad plan`,
now with the daemon's state of this boot, has nothing to do.

Values are read back with iproute2 and sysfs, not with rdmad's own code.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import Guest, log
from service import history
from service import status_text as status

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

SNAPSHOT = "/etc/rdmad/rdmad.d/50-snapshot.toml"


def vf_settings(g: Guest, pf_netdev: str) -> dict[int, dict[str, Any]]:
    return {int(e["vf"]): e for e in g.vf_info(pf_netdev)}


def drivers(g: Guest, bdfs: list[str]) -> dict[str, str | None]:
    """Each VF's bound driver (None: unbound), from its sysfs driver link."""
    out: dict[str, str | None] = {}
    for bdf in bdfs:
        res = g.run(f"basename $(readlink {g.pci_path(bdf, 'driver')})")
        out[bdf] = res.out.strip() if res.ok and res.out.strip() else None
    return out


def rxe_links(g: Guest) -> set[tuple[str, str]]:
    return {(lk["ifname"], lk.get("netdev", "")) for lk in g.rdma_links()}


@pytest.mark.lab_needs("reboot")
def test_hand_set_node_snapshotted_comes_back_identical_after_reboot(
    installed_guest: Guest,
) -> None:
    g = installed_guest
    assert g.install_rdmad().unit_installed
    nic = g.check("ls /sys/bus/virtio/drivers/virtio_net/virtio*/net | head -n1").strip()
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]

    # --- the node, set up by hand ---------------------------------------------------------
    g.check(f"rdma link add rxe0 type rxe netdev {nic}", timeout=120)
    assert g.set_numvfs(pf, 4).ok
    g.wait_vf_netdevs(pf, 4)
    vfs = g.vf_bdfs(pf)
    for cmd in (
        "vf 0 mac 02:00:00:00:5a:00 vlan 310 qos 3",
        "vf 1 mac 02:00:00:00:5a:01 spoofchk off trust on",
        "vf 2 mac 02:00:00:00:5a:02",
    ):
        g.check(f"ip link set dev {pf_netdev} {cmd}")
    g.check(f"echo {vfs[2]} > /sys/bus/pci/drivers/igbvf/unbind")  # no driver_override
    g.bind_vfio(vfs[3])
    before_vfs = vf_settings(g, pf_netdev)
    before_drivers = drivers(g, vfs)
    assert list(before_drivers.values()) == ["igbvf", "igbvf", None, "vfio-pci"]
    before_rxe = rxe_links(g)
    assert ("rxe0", nic) in before_rxe

    # --- written down ---------------------------------------------------------------------
    g.check(f"mkdir -p /etc/rdmad/rdmad.d && rdmad snapshot -o {SNAPSHOT}", timeout=120)
    text = g.check(f"cat {SNAPSHOT}")
    log(f"rdmad snapshot wrote:\n{text}")
    assert f'pf = {{ pci = "{pf}" }}' in text
    assert f'[[rxe]]\nname = "rxe0"\nnetdev = {{ name = "{nic}" }}' in text
    assert 'driver = "none"' in text and 'driver = "vfio-pci"' in text
    assert '# link_state = "auto"  (igb cannot set it)' in text
    assert "\nlink_state" not in text and "\nmin_tx_rate" not in text  # never declared on igb

    plan = g.json("rdmad plan --json", timeout=120)
    assert (
        plan["state"]["line"] == "state: none at /var/lib/rdmad/state.json: rdmad owns no rxe link"
    )
    # Everything matches; VF 2 is only pinned unbound (driver_override), so that a
    # re-probe cannot bind it again; and no daemon has installed the driver guard yet.
    assert [a["describe"] for a in plan["actions"]] == [
        f"{vfs[2]}: driver unset -> none",
        "guard `modprobe -r` of igb, rdma_rxe (modprobe.d hook)",
    ], plan

    g.check("systemctl enable --now rdmad.service", timeout=300)
    g.wait_for(
        "systemctl show -p StatusText --value rdmad | grep -q '2 object(s), 2 converged'",
        timeout=120,
    )
    assert g.read(g.pci_path(vfs[2], "driver_override")).strip() == "none"
    assert drivers(g, vfs) == before_drivers
    assert vf_settings(g, pf_netdev) == before_vfs and rxe_links(g) == before_rxe

    # --- reboot: the node comes back as it was -------------------------------------------
    g.reboot()
    want_drivers = before_drivers

    def restored() -> bool:
        try:
            return (
                vf_settings(g, pf_netdev) == before_vfs
                and drivers(g, g.vf_bdfs(pf)) == want_drivers
                and rxe_links(g) == before_rxe
            )
        except Exception:  # VFs and their netdevs still appearing
            return False

    try:
        took = g.wait_until(restored, timeout=300, interval=0.5, what="node restored")
    except Exception:
        log(f"status: {status(g)}\nhistory: {history(g)[-12:]}")
        log(f"VFs: {vf_settings(g, pf_netdev)}\ndrivers: {drivers(g, g.vf_bdfs(pf))}")
        raise
    log(f"after reboot the node matched its snapshot {took:.1f} s after boot (host polling)")
    assert g.vf_bdfs(pf) == vfs
    g.wait_for(
        "systemctl show -p StatusText --value rdmad | grep -q '2 object(s), 2 converged'",
        timeout=120,
    )
    # The running daemon's own next pass (its /v1/plan) is empty...
    plan = g.json("rdmad plan --daemon --json", timeout=120)
    assert plan["source"] == "daemon" and plan["actions"] == [], plan
    # ...and so is a plan made here from the config on disk and the state file it saved
    # (which owns rxe0).
    plan = g.json("rdmad plan --json", timeout=120)
    assert plan["source"] == "local" and plan["actions"] == [], plan
    assert plan["state"]["line"].startswith(
        "state: /var/lib/rdmad/state.json, written this boot: rdmad-created rxe links: rxe0"
    ), plan["state"]
