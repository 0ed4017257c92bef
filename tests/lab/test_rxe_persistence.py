"""Issue #8 on a real 6.1 kernel: rdmad keeps declared rxe links present, always.

rdmad runs under systemd in the guest with a drift interval of one hour, so
anything restored within a test was restored by an event (udev, rtnetlink),
never by the drift timer; where it matters the history in
/var/lib/rdmad/state.json is read to check the trigger of the re-creation.

Facts found on the way (kernel 6.1, see also shared/LAB.md):

* rdma_rxe has no module parameters (no /sys/module/rdma_rxe/parameters,
  ``modinfo -p rdma_rxe`` is empty): rdmad declares none.
* Moving a netdev into another namespace removes its rxe link, and moving it
  back does not bring it back; renaming keeps it (the link follows the ifindex).
* The Debian kernel has no siw module: the only RDMA driver in the guest is rxe,
  so "a non-rxe device with the declared name" is covered by the unit tests only.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from harness import Guest
from service import STATE, reload, start, status_text, write_config

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

# Under TCG with another guest on the same two cores a single event-driven
# re-creation has been seen to take well under a second; leave room for load.
EVENT_DEADLINE = 30.0


def daemon_config(*rxe: tuple[str, str], extra: str = "") -> str:
    """[daemon] with a drift timer that cannot fire during a test, plus [[rxe]] objects.

    Each rxe is (name, netdev reference as an inline TOML table body).
    """
    lines = ["[daemon]", 'drift_interval = "1h"', 'settle = "150ms"', ""]
    for name, ref in rxe:
        lines += ["[[rxe]]", f'name = "{name}"', f"netdev = {{ {ref} }}", ""]
    return "\n".join(lines) + extra


def link_on(name: str, netdev: str) -> str:
    """Shell condition: RDMA link NAME exists on NETDEV."""
    pattern = f"^link {name}/1 .*netdev {netdev}( |$)"
    return f"rdma link show | grep -Eq {shlex.quote(pattern)}"


def wait_link(g: Guest, name: str, netdev: str, timeout: float = EVENT_DEADLINE) -> None:
    g.wait_for(link_on(name, netdev), timeout=timeout)


def present(g: Guest, name: str) -> bool:
    return g.exists(f"/sys/class/infiniband/{name}")


def timed(g: Guest, action: str, name: str, timeout: float = EVENT_DEADLINE) -> float:
    """Run ``action`` in the guest, then seconds (guest clock) until RDMA device NAME exists."""
    steps = int(timeout / 0.01)
    script = f"""set -e
{action}
t0=$(date +%s.%N)
n=0
while [ ! -e /sys/class/infiniband/{name} ]; do
  n=$((n + 1)); [ "$n" -lt {steps} ] || {{ echo "not back after {timeout:g} s" >&2; exit 1; }}
  sleep 0.01
done
t1=$(date +%s.%N)
echo "$t0 $t1"
"""
    t0, t1 = g.check(script, timeout=timeout + 60).split()
    return float(t1) - float(t0)


def rxe_entries(g: Guest, name: str) -> list[dict[str, Any]]:
    """History entries of object 'rxe NAME' from the state file."""
    state = g.json(f"cat {STATE}")
    return [h for h in state["history"] if h["obj"] == f"rxe {name}"]


def added(g: Guest, name: str) -> list[dict[str, Any]]:
    return [
        h
        for h in rxe_entries(g, name)
        if h["event"] == "applied" and h["what"].startswith(f"rdma link {name}: unset -> rxe on")
    ]


def wait_added(g: Guest, name: str, count: int, timeout: float = EVENT_DEADLINE) -> dict[str, Any]:
    """The count-th 'add' of NAME in the state file's history (it is saved after the pass)."""
    g.wait_until(
        lambda: g.exists(STATE) and len(added(g, name)) >= count,
        timeout=timeout,
        interval=0.5,
        what=f"{count} add(s) of {name} in {STATE}",
    )
    return added(g, name)[count - 1]


def settled(g: Guest) -> None:
    """udevd done with the events so far, then one rdmad pass after all of them: a pass
    at rest has armed its reactions (reconcile.reactions), and no late copy of an earlier
    event is left to start a pass that would meet the next event first. systemd's jobs
    first: rdma-core's rdma-load-modules@ units, started by an RDMA device's appearance,
    load modules (ib_iser, rpcrdma...) for seconds after it, and each module's uevent
    can come after udevd settled."""
    g.wait_for('[ -z "$(systemctl list-jobs --no-legend)" ]', timeout=120, interval=0.5)
    g.check("udevadm settle --timeout=60", timeout=90)
    res = g.run("rdmad-ctl reconcile --wait 60", timeout=90)
    # 1 with a pass reported: it ran, and an object waits (its netdev is gone, here).
    assert res.rc in (0, 1) and res.out.startswith("reconcile: pass"), res.describe()


def assert_event_driven(entry: dict[str, Any], *, planned_ahead: bool = False) -> None:
    """Added because of an event; ``planned_ahead``: by the reaction the pass before
    planned for exactly that event (rdmad.reconcile.reactions), not by a pass after it,
    and sent by the event reader itself as it read the event (rdmad.kernel.events.reflex)."""
    cause = entry["cause"]
    assert "drift" not in cause, entry
    assert any(src in cause for src in ("udev", "netlink", "driver-reload")), entry
    if planned_ahead:
        assert cause.endswith(" (planned ahead, sent as the event was read)"), entry


@pytest.fixture
def rdmad(guest: Guest) -> Guest:
    """The shared guest with rdmad installed (not started); everything undone after."""
    report = guest.install_rdmad()
    assert report.unit_installed
    guest.run("rm -rf /etc/rdmad /var/lib/rdmad")
    return guest


def virtio_netdev(g: Guest) -> str:
    return g.check("ls /sys/bus/virtio/drivers/virtio_net/virtio*/net | head -n1").strip()


def test_virtio_rxe_recreated_by_event_and_after_module_reload(rdmad: Guest) -> None:
    """rxe0 on the virtio NIC: created; deleted -> back by event; rdma_rxe removed -> back."""
    g = rdmad
    nic = virtio_netdev(g)
    start(g, daemon_config(("rxe0", f'name = "{nic}"')))
    wait_link(g, "rxe0", nic)
    assert "rxe0" in g.check("ibv_devices")
    assert ("rxe0", nic) in {(lk["ifname"], lk.get("netdev")) for lk in g.rdma_links()}
    first = wait_added(g, "rxe0", 1)
    assert first["cause"] == "first-start", first

    # Someone deletes it: the udev/RDMA events bring it back, not the drift timer.
    settled(g)
    seconds = timed(g, "rdma link delete rxe0", "rxe0")
    wait_link(g, "rxe0", nic)
    again = wait_added(g, "rxe0", 2)
    assert_event_driven(again, planned_ahead=True)
    # How fast is bench/bench_rxe.py's business; here only that it came back by an event.
    print(f"rdma link delete -> rxe0 back in {seconds:.3f} s (cause {again['cause']!r})")

    # rdma_rxe unloaded behind the guard's back (rmmod skips modprobe.d): every link goes
    # with it and rdmad loads it back. (`modprobe -r` asks the guard, and rdmad stands
    # back until the stack is back: tests/lab/test_guard_lab.py.)
    seconds = timed(g, "rmmod rdma_rxe", "rxe0", timeout=60)
    wait_link(g, "rxe0", nic)
    assert g.module_loaded("rdma_rxe")
    third = wait_added(g, "rxe0", 3)
    assert "drift" not in third["cause"], third
    print(f"rmmod rdma_rxe -> rxe0 back in {seconds:.3f} s (cause {third['cause']!r})")
    assert status_text(g).startswith("1 object(s), 1 converged"), status_text(g)


def test_rename_follows_name_and_mac_references(rdmad: Guest) -> None:
    """A name reference follows the name; a MAC reference follows the device."""
    g = rdmad
    mac = "02:00:00:00:0c:02"
    g.check(f"ip link add labrtmp type veth peer name labrm0 address {mac}")
    config = daemon_config(("rxn", 'name = "labrn0"'), ("rxm", f'mac = "{mac}"'))
    start(g, config)  # returns after READY=1, i.e. after the first pass
    wait_link(g, "rxm", "labrm0")
    assert not present(g, "rxn")  # nothing is named labrn0 yet: waiting

    # The usual case: a netdev appears under a kernel name and is renamed to the
    # declared one (udev does this for VFs). Renames need the netdev down on 6.1.
    g.check("ip link set labrtmp name labrn0")
    wait_link(g, "rxn", "labrn0")
    assert_event_driven(wait_added(g, "rxn", 1))

    # Rename the MAC-referenced netdev: the kernel keeps the link on it and rdmad
    # has nothing to do (no delete, no re-add).
    g.check("ip link set labrm0 name labrm9")
    wait_link(g, "rxm", "labrm9")
    # Up, with addresses: links that can serve (status counts a port DOWN as pending).
    g.check(
        "ip link set labrn0 up && ip link set labrm9 up && "
        "ip addr add 10.79.4.1/32 dev labrn0 && ip addr add 10.79.4.2/32 dev labrm9"
    )
    reload(g, config)  # one more full pass over the renamed node, and wait for its end
    assert "2 converged" in status_text(g), status_text(g)
    assert [h for h in rxe_entries(g, "rxm") if "-> unset" in h["what"]] == []
    assert len(added(g, "rxm")) == 1
    wait_link(g, "rxm", "labrm9", timeout=5)

    # Rename the name-referenced netdev away: the declared name now names nothing (as
    # after a typo), so the working link is kept and rdmad says why; renamed back, the
    # link is where the declaration says again, never deleted or re-added.
    g.check("ip link set labrn0 down && ip link set labrn0 name labrn9")
    g.wait_for(
        "systemctl show -p StatusText --value rdmad.service | grep -q 'the working link is kept'",
        timeout=EVENT_DEADLINE,
    )
    assert g.run(link_on("rxn", "labrn9")).rc == 0
    g.check("ip link set labrn9 name labrn0 && ip link set labrn0 up")
    g.wait_for("systemctl show -p StatusText --value rdmad.service | grep -q '2 converged'", 60)
    wait_link(g, "rxn", "labrn0")
    assert [h for h in rxe_entries(g, "rxn") if "-> unset" in h["what"]] == []
    assert len(added(g, "rxn")) == 1


def test_veth_recreated_and_netns_round_trip(rdmad: Guest) -> None:
    """Delete and re-create the netdev; move it into a namespace and back."""
    g = rdmad
    g.check("ip link add labrv0 type veth peer name labrv1")
    start(g, daemon_config(("rxv", 'name = "labrv0"')))
    wait_link(g, "rxv", "labrv0")

    g.check("ip link del labrv0")
    # The kernel removes the rxe link with its netdev, but asynchronously (a work item
    # after NETDEV_UNREGISTER): wait for it, bounded.
    g.wait_for("[ ! -e /sys/class/infiniband/rxv ]", timeout=EVENT_DEADLINE)
    settled(g)
    seconds = timed(g, "ip link add labrv0 type veth peer name labrv1", "rxv")
    wait_link(g, "rxv", "labrv0")
    # Not necessarily planned ahead: the peer (labrv1) may be announced alone first, and
    # the pass for it may add rxv when labrv0's news comes during it (bench/RESULTS.md).
    assert_event_driven(wait_added(g, "rxv", 2))
    print(f"veth re-created -> rxv back in {seconds:.3f} s")

    g.check("ip netns add labrns && ip link set labrv0 netns labrns")
    g.wait_for("[ ! -e /sys/class/infiniband/rxv ]", timeout=10)
    settled(g)
    seconds = timed(g, "ip -n labrns link set labrv0 netns 1", "rxv")
    wait_link(g, "rxv", "labrv0")
    assert_event_driven(wait_added(g, "rxv", 3), planned_ahead=True)
    print(f"netdev back in the init namespace -> rxv back in {seconds:.3f} s")


def test_bond_rebuild(rdmad: Guest) -> None:
    """rxe on a bond survives deleting and rebuilding the bond."""
    g = rdmad
    if not g.run("modprobe bonding").ok:
        pytest.skip("the guest kernel has no bonding module")
    build = "ip link add labrb0 type bond && ip link set labrs0 master labrb0"
    g.check(f"ip link add labrs0 type veth peer name labrs1 && {build}")
    start(g, daemon_config(("rxb", 'name = "labrb0"')))
    wait_link(g, "rxb", "labrb0")

    g.check("ip link del labrb0")
    seconds = timed(g, build, "rxb")
    wait_link(g, "rxb", "labrb0")
    assert_event_driven(wait_added(g, "rxb", 2))
    print(f"bond rebuilt -> rxb back in {seconds:.3f} s")


def test_name_conflicts_reported_never_fixed(rdmad: Guest) -> None:
    """Someone else's rxe with the declared name, or on the declared netdev, is left alone."""
    g = rdmad
    g.check(
        "ip link add labrc0 type veth peer name labrc1 && "
        "rdma link add rxc type rxe netdev labrc1"  # not rdmad's
    )
    start(g, daemon_config(("rxc", 'name = "labrc0"'), ("rxd", 'name = "labrc1"')))
    g.wait_for("systemctl show -p StatusText --value rdmad.service | grep -q '2 blocked'", 60)
    wait_link(g, "rxc", "labrc1", timeout=5)  # untouched
    assert not present(g, "rxd")
    planned = g.run("rdmad plan --json", timeout=120)
    assert planned.rc == 1, planned.describe()  # the plan leaves both objects blocked
    plan = json.loads(planned.out)
    messages = {o["obj"]: o["reason"] for o in plan["objects"]}
    assert "rxe rxc is on labrc1" in messages["rxe rxc"], messages
    assert "not created by rdmad" in messages["rxe rxc"], messages
    assert "labrc1 already carries rxe link 'rxc'" in messages["rxe rxd"], messages
    state = g.json(f"cat {STATE}")
    assert state["managed_rxe"] == []
    assert not any(h["what"].endswith("-> unset") for h in state["history"]), state["history"]


def test_stale_managed_rxe_held_open_is_kept(rdmad: Guest) -> None:
    """An rxe rdmad created and that is no longer declared stays while a process holds it."""
    g = rdmad
    g.check("ip link add labrh0 type veth peer name labrh1")
    start(g, daemon_config(("rxh", 'name = "labrh0"')))
    wait_link(g, "rxh", "labrh0")
    find = (
        "for d in /sys/class/infiniband_verbs/uverbs*; do "
        '[ "$(cat $d/ibdev 2>/dev/null)" = rxh ] && echo ${d##*/}; done; true'
    )
    g.wait_for(f'[ -n "$({find})" ]', timeout=30)
    node = "/dev/infiniband/" + g.check(find).split()[0]
    unit, pid = g.hold_open(node)

    reload(g, daemon_config())  # rxh no longer declared
    g.wait_for(
        "systemctl show -p StatusText --value rdmad.service "
        "| grep -q 'no longer declared but in use'",
        timeout=60,
    )
    assert f"pid {pid}" in status_text(g), status_text(g)
    wait_link(g, "rxh", "labrh0", timeout=5)

    # Once nothing holds it, the next pass removes it (it is rdmad's own).
    g.stop_unit(unit)
    g.check("systemctl reload rdmad.service")
    g.wait_for("[ ! -e /sys/class/infiniband/rxh ]", timeout=60)
    assert any(h["what"] == "rdma link rxh: rxe on labrh0 -> unset" for h in rxe_entries(g, "rxh"))


def _vf_bdf(g: Guest, pf: str, index: int) -> str:
    """VF index's PCI address from the PF's SR-IOV offset and stride (before VFs exist)."""
    offset = int(g.read(g.pci_path(pf, "sriov_offset")))
    stride = int(g.read(g.pci_path(pf, "sriov_stride")))
    dom, bus, devfn = pf[:4], int(pf[5:7], 16), int(pf[8:10], 16) << 3 | int(pf[11], 16)
    rid = (bus << 8 | devfn) + offset + stride * index
    return f"{dom}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"


def test_rxe_on_igb_vf_survives_pf_driver_reload(rdmad: Guest) -> None:
    """VFs, their settings and the rxe link on VF 0 return after `modprobe -r igb; modprobe igb`."""
    g = rdmad
    pf = g.igb_pf()
    vf0 = _vf_bdf(g, pf, 0)
    mac = "02:00:00:00:0b:00"
    # driver_guard off: an rxe link on a VF makes the VF in use, and the guard would
    # (rightly) refuse the `modprobe -r igb` this test is about.
    sriov = f"""
[[sriov]]
pf = {{ pci = "{pf}" }}
numvfs = 2
driver_guard = false
[[sriov.vf]]
index = 0
mac = "{mac}"
vlan = 42
"""
    text = daemon_config(("rxvf", f'pci = "{vf0}"'), extra=sriov)
    start(g, text)

    def restored() -> str:
        netdevs = g.wait_vf_netdevs(pf, 2, timeout=120)
        vf_netdev = netdevs[vf0]
        wait_link(g, "rxvf", vf_netdev, timeout=120)
        g.wait_for(
            f"ip link show $(ls /sys/bus/pci/devices/{pf}/net) | grep -q 'vf 0 .*{mac}.*vlan 42'",
            timeout=60,
        )
        return vf_netdev

    before = restored()
    reload_s = g.run("modprobe -r igb && modprobe igb", timeout=180)
    assert reload_s.ok, reload_s.describe()
    after = restored()
    assert after == before
    assert g.numvfs(pf) == 2
    assert_event_driven(wait_added(g, "rxvf", 2, timeout=120))


@pytest.mark.lab_needs("reboot")
def test_rxe_present_after_guest_reboot(installed_guest: Guest) -> None:
    """Enabled at boot, rdmad re-creates the rxe link nothing else persists."""
    g = installed_guest
    g.install_rdmad()
    nic = virtio_netdev(g)
    mac = g.read(f"/sys/class/net/{nic}/address")
    write_config(g, daemon_config(("rxe0", f'mac = "{mac}"')))
    g.check("systemctl enable --now rdmad.service", timeout=300)
    wait_link(g, "rxe0", nic)

    g.reboot()
    wait_link(g, "rxe0", nic, timeout=180)
    assert "rxe0" in g.check("ibv_devices")
    assert ("rxe0", nic) in {(lk["ifname"], lk.get("netdev")) for lk in g.rdma_links()}
    g.wait_until(
        lambda: any(h["cause"] == "boot" for h in added(g, "rxe0")),
        timeout=60,
        interval=1.0,
        what="the post-reboot add of rxe0 recorded with cause 'boot'",
    )
