"""Restored means working: rdma_cm and verbs traffic across rdmad's own rxe links.

rdmad is installed from the .deb and runs as the shipped unit. Two rxe links are
declared on the two ends of a veth pair (tests/lab/traffic.py); after every path by
which rdmad (re)creates them, an rdma_cm connection (rping: connect, RDMA READ/WRITE
of its ping data, verified) and RC verbs traffic (ibv_rc_pingpong) must cross the pair:

* first start (`systemctl restart rdmad` with the links declared),
* `rdma link delete`, answered by the add the event readers send themselves,
* the netdev deleted and re-created,
* `rmmod rdma_rxe` (rdmad loads it back itself, as a child of the unit),
* `modprobe -r rdma_rxe; modprobe rdma_rxe` (the guard lets it go, rdmad stands back
  until the module is back),
* a reboot with rdmad enabled (fresh guest).

Why each path is its own check: kernel objects made on rdmad's behalf live in its
cgroup and namespaces. The rxe device's GSI QP, which carries rdma_cm's MADs, and its
kernel socket are created by the process that registers the device; with the unit's old
`IPAddressDeny=any` (a cgroup BPF filter) every CM MAD rdmad's links sent was dropped,
and rping hung in CONNECT while verbs QPs made by other processes worked and status said
"converged" (packaging/README.md: what each sandboxing directive was checked against).
"""

from __future__ import annotations

import pytest
from harness import Guest, log
from service import ctl, reload, start, status_text, write_config
from traffic import (
    END_A,
    RXE_A,
    RXE_B,
    check_traffic,
    install_pair_at_boot,
    links_ready,
    make_pair,
    rxe_config,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

DAEMON = '[daemon]\ndrift_interval = "1h"\nsettle = "150ms"\n\n'


@pytest.fixture
def rdmad(guest: Guest) -> Guest:
    """The shared guest with the package installed (not started) and the veth pair."""
    report = guest.install_rdmad()
    assert report.compiled and report.unit_installed, report.output
    guest.run("rm -rf /etc/rdmad /var/lib/rdmad")
    make_pair(guest)
    return guest


def gone(g: Guest, *names: str) -> None:
    g.wait_for(" && ".join(f"[ ! -e /sys/class/infiniband/{n} ]" for n in names), timeout=60)


def test_traffic_after_every_restore_path(rdmad: Guest) -> None:
    g = rdmad
    start(g, DAEMON + rxe_config())
    check_traffic(g, "after the first start")
    assert status_text(g).startswith("2 object(s), 2 converged"), status_text(g)

    g.check(f"udevadm settle --timeout=60 && rdma link delete {RXE_A}", timeout=90)
    check_traffic(g, f"after `rdma link delete {RXE_A}`")

    g.check(f"ip link del {END_A}")
    gone(g, RXE_A, RXE_B)
    make_pair(g)
    check_traffic(g, "after the veth pair was deleted and re-created")

    g.check("rmmod rdma_rxe", timeout=60)
    check_traffic(g, "after rmmod rdma_rxe")

    res = g.run("modprobe -r rdma_rxe && modprobe rdma_rxe", timeout=180)
    assert res.ok, res.describe()
    check_traffic(g, "after modprobe -r rdma_rxe; modprobe rdma_rxe")
    assert status_text(g).startswith("2 object(s), 2 converged"), status_text(g)


def wait_status(g: Guest, text: str, timeout: float = 60.0) -> None:
    g.wait_for(
        f"systemctl show -p StatusText --value rdmad.service | grep -qF {text!r}", timeout=timeout
    )


def test_status_says_when_a_restored_link_cannot_serve(rdmad: Guest) -> None:
    """Present is not working: a link whose port is not ACTIVE, or that has no GID made
    from an IP address, is not converged (exit 1) and status says why; the netdev's own
    events (link state, address) bring it back to converged, with no drift pass."""
    g = rdmad
    start(g, DAEMON + rxe_config())
    links_ready(g)
    wait_status(g, "2 object(s), 2 converged")

    g.check(f"ip link set {END_A} down")  # and so no carrier on its peer either
    wait_status(g, f"rxe {RXE_A} on {END_A} cannot carry traffic: its port is DOWN")
    table = ctl(g, "status")
    assert table.rc == 1 and "cannot carry traffic" in table.out, table.describe()
    g.check(f"ip link set {END_A} up")
    wait_status(g, "2 object(s), 2 converged")
    assert ctl(g, "status").rc == 0

    # A third link on a netdev with no address (only its link-local GID): up, ACTIVE,
    # and unreachable for rdma_cm. An address added later is heard, and its GID seen.
    g.check("ip link add labcn0 type veth peer name labcn1 && ip link set labcn1 up "
            "&& ip link set labcn0 up")  # fmt: skip
    third = '[[rxe]]\nname = "rxcn"\nnetdev = { name = "labcn0" }\n'
    reload(g, DAEMON + rxe_config() + third)
    wait_status(g, "it has no GID made from an IP address of labcn0")
    doc = ctl(g, "status", "--json")
    assert doc.rc == 1, doc.describe()
    g.check("ip addr add 10.78.0.1/32 dev labcn0")
    wait_status(g, "3 object(s), 3 converged", timeout=30)
    g.run("ip link del labcn0")


@pytest.mark.lab_needs("reboot")
def test_traffic_after_reboot(installed_guest: Guest) -> None:
    """Enabled at install, rdmad re-creates both links at boot and they carry traffic."""
    g = installed_guest
    report = g.install_rdmad()
    assert report.compiled and report.unit_installed, report.output
    install_pair_at_boot(g)
    write_config(g, DAEMON + rxe_config())
    g.check("systemctl enable rdmad.service && systemctl restart rdmad.service", timeout=300)
    check_traffic(g, "after the first start")

    boot = g.reboot()
    log(f"rebooted in {boot}")
    links_ready(g, timeout=180)
    check_traffic(g, "after a reboot")
