"""The driver guard on the lab's real 6.1 kernel: `modprobe -r igb` through rdmad's hook.

One rdmad run declares igb's 2 VFs (driver_guard defaults to true) and installs
/etc/modprobe.d/rdmad-guard.conf; then, each read back from the kernel:

* VF 1 on vfio-pci with its group held open by a test process: `modprobe -r igb`
  fails naming that pid and the override, and the VFs are untouched;
  `rdmad-ctl guard check igb --json` says the same; the process gone, the unload
  goes through and rdmad restores the VFs once igb is back (its pause ends);
* rdmad stopped: the hook still refuses (the guard needs no daemon);
* RDMAD_GUARD_FORCE=1: allowed, and the journal names the override and its caller;
* VF 0's netdev moved into a namespace: refused, naming the namespace;
* an rxe link on VF 0 held by a verbs user (a process holding its uverbs node): refused;
* `driver_guard = false` on reload: the hook file is gone.

A forced `modprobe -r rdma_rxe` the kernel refuses (a verbs user pins it): the pause
the guard wrote before it ends at once, and the history tells both. And a stack stop
while rdmad runs: `modprobe -r rdma_rxe`, then the modules that
held ib_core, then ib_core, goes through (rdmad stands back: the status names the
pause and who asked), and rdmad restores the rxe link once the modules are back.

Unloads the kernel refuses by itself, and timings, are not this file's business.
"""

from __future__ import annotations

import json

import pytest
from harness import Guest, log
from service import ctl, ctl_status, journal, reload, start, wait_passes
from service import status_text as status

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]

HOOK = "/etc/modprobe.d/rdmad-guard.conf"
NETNS = "labguard"


def config(pf: str, guard: bool = True, rxe: str = "") -> str:
    text = (
        '[daemon]\ndrift_interval = "2s"\nlog_level = "debug"\n\n'
        f'[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = 2\n'
    )
    if not guard:
        text += "driver_guard = false\n"
    if rxe:
        text += f'\n[[rxe]]\nname = "rxg0"\nnetdev = {{ name = "{rxe}" }}\n'
    return text


def unload_igb(g: Guest, env: str = "") -> tuple[bool, str]:
    res = g.run(f"{env} modprobe -r igb", timeout=240)
    return res.ok, res.out + res.err


@pytest.fixture
def rdmad_guest(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    return guest


def test_modprobe_r_igb_refused_while_a_vf_is_in_use(rdmad_guest: Guest) -> None:
    g = rdmad_guest
    pf = g.igb_pf()
    start(g, config(pf))
    g.wait_for(
        f"grep -q '^remove igb .* -m rdmad.guard remove igb$' {HOOK}",
        60,
    )
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 120)
    vf0_pci, vf1_pci = g.vf_bdfs(pf)
    table, doc = ctl_status(g)
    obj = next(o for o in doc["objects"] if o["obj"] == f"sriov pci={pf}")
    assert obj["observed"]["guard"] == "installed (modprobe -r igb asks the guard)", obj
    assert "guard installed" in table.out, table.out

    # --- a VF on vfio-pci, its group held open -----------------------------------------------
    group = g.bind_vfio(vf1_pci)
    unit, pid = g.hold_open(f"/dev/vfio/{group}")
    try:
        ok, words = unload_igb(g)
        assert not ok, words
        assert f"pid {pid} (sleep) holds /dev/vfio/{group}" in words, words
        assert f"VF 1 ({vf1_pci}) of PF {pf}" in words and "RDMAD_GUARD_FORCE=1" in words, words
        assert g.module_loaded("igb") and g.numvfs(pf) == 2
        assert g.vf_bdfs(pf) == [vf0_pci, vf1_pci]
        check = ctl(g, "guard", "check", "igb", "--json")
        assert check.rc == 1, check.describe()
        held = json.loads(check.out)["decisions"][0]["held"]
        assert [h["holders"] for h in held] == [[f"pid {pid} (sleep) holds /dev/vfio/{group}"]]

        # The daemon down changes nothing: the hook decides by itself.
        g.check("systemctl stop rdmad.service", timeout=120)
        ok, words = unload_igb(g)
        assert not ok and f"pid {pid} (sleep)" in words, words
        assert g.numvfs(pf) == 2
        g.check("systemctl start rdmad.service", timeout=300)
    finally:
        g.stop_unit(unit)

    # --- the holder gone: allowed; rdmad stands back, then restores once igb is back ----------
    ok, words = unload_igb(g)
    assert ok, words
    assert not g.module_loaded("igb")
    g.check("modprobe igb", timeout=180)
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 180)
    g.wait_until(
        lambda: json.loads(ctl(g, "status", "--json").out)["daemon"]["pause"] is None,
        timeout=60,
        what="the pause over once igb is loaded again",
    )

    # --- forced: allowed and logged with the caller --------------------------------------------
    group = g.bind_vfio(g.vf_bdfs(pf)[1])
    unit, pid = g.hold_open(f"/dev/vfio/{group}")
    try:
        ok, words = unload_igb(g, "RDMAD_GUARD_FORCE=1")
        assert ok, words
        assert "forced" in words, words
        logged = g.check("journalctl -b -t rdmad-guard --no-pager -o cat", timeout=60)
        assert "FORCED `modprobe -r igb` by " in logged and f"pid {pid} (sleep)" in logged, logged
        assert "modprobe (pid " in logged, logged  # the caller's process chain
    finally:
        g.stop_unit(unit)
    g.check("modprobe igb", timeout=180)
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 180)
    vf0 = g.wait_vf_netdevs(pf, 2, timeout=120)[g.vf_bdfs(pf)[0]]

    # --- VF 0's netdev in another namespace ----------------------------------------------------
    g.check(f"ip netns add {NETNS} && ip link set {vf0} netns {NETNS}", timeout=60)
    ok, words = unload_igb(g)
    assert not ok, words
    assert f"is in network namespace '{NETNS}'" in words and "move the netdev back" in words, words
    g.check(f"ip -n {NETNS} link set {vf0} netns 1 && ip netns del {NETNS}", timeout=60)
    g.wait_for(f"test -e /sys/class/net/{vf0}", 30)

    # --- an rxe link on VF 0 with a verbs user --------------------------------------------------
    g.check(f"rdma link add rxg9 type rxe netdev {vf0}", timeout=120)
    g.wait_for("test -e /sys/class/infiniband/rxg9", 30)
    uverbs = g.uverbs_node("rxg9")
    unit, pid = g.hold_open(uverbs)
    try:
        ok, words = unload_igb(g)
        assert not ok, words
        assert (
            f"{vf0} carries rxe link rxg9" in words and f"pid {pid} (sleep) holds {uverbs}" in words
        )
        assert g.module_loaded("igb") and [r["ifname"] for r in g.rdma_links()] == ["rxg9"]
    finally:
        g.stop_unit(unit)
        g.run("rdma link delete rxg9", timeout=60)

    # --- driver_guard = false: the hook goes -----------------------------------------------------
    reload(g, config(pf, guard=False))
    g.wait_for(f"[ ! -e {HOOK} ]", 60)
    _, doc = ctl_status(g)
    obj = next(o for o in doc["objects"] if o["obj"] == f"sriov pci={pf}")
    assert obj["observed"]["guard"] == "off (driver_guard = false)", obj


def test_stack_stop_through_the_hook_while_rdmad_runs(rdmad_guest: Guest) -> None:
    """rdmad does not reload rdma_rxe under a guarded stack stop, and restores after it."""
    g = rdmad_guest
    pf = g.igb_pf()
    nic = g.check("ls /sys/bus/virtio/drivers/virtio_net/virtio*/net | head -n1").strip()
    start(g, config(pf, rxe=nic))
    g.wait_for("test -e /sys/class/infiniband/rxg0", 120)
    g.wait_for(f"grep -q '^remove rdma_rxe ' {HOOK}", 60)

    # A forced unload the kernel refuses (a verbs user pins rdma_rxe): the guard paused
    # rdmad before it and ends the pause as soon as modprobe fails, and the history says so.
    unit, _ = g.hold_open(g.uverbs_node("rxg0"))
    try:
        res = g.run("RDMAD_GUARD_FORCE=1 modprobe -r rdma_rxe", timeout=240)
        assert not res.ok and "in use" in res.out + res.err, res.describe()
        assert g.module_loaded("rdma_rxe")
    finally:
        g.stop_unit(unit)
    why = "the unload of rdma_rxe failed (modprobe exit 1): rdma_rxe is still loaded"
    assert json.loads(g.check("cat /run/rdmad/pause.json"))["ended_why"] == why
    wait_passes(g, 2)
    assert ctl_status(g)[1]["daemon"]["pause"] is None
    entries = json.loads(ctl(g, "history", "--json").out)["entries"]
    told = [
        (e["event"], e["cause"][:22], e["reason"])
        for e in entries
        if e["event"] in ("paused", "resumed")
    ]
    assert told == [
        ("paused", "`modprobe -r rdma_rxe`", "guarded stop of the RDMA stack"),
        ("resumed", "`modprobe -r rdma_rxe`", why),
    ], entries

    stop = (
        "modprobe -r rdma_rxe && "
        # then everything that held ib_core (rdma-core's udev rules load rdma_cm & co.)
        "for i in 1 2 3 4 5; do for m in $(ls /sys/module/ib_core/holders 2>/dev/null); do "
        "modprobe -r $m 2>/dev/null; done; done; modprobe -r ib_core"
    )
    res = g.run(stop, timeout=240)
    try:
        assert res.ok, res.describe()
        assert not g.module_loaded("ib_core") and not g.module_loaded("rdma_rxe")
        wait_passes(g, 2)  # rdmad's own record: two more passes, nothing loaded
        assert not g.module_loaded("rdma_rxe") and not g.module_loaded("ib_core")
        table, doc = ctl_status(g)
        pause = doc["daemon"]["pause"]
        assert pause is not None and pause["by"].startswith("`modprobe -r rdma_rxe` ("), pause
        assert "PAUSED" in table.out and "modprobe -r rdma_rxe" in table.out, table.out
        rxe = next(o for o in doc["objects"] if o["obj"] == "rxe rxg0")
        assert "held back" in rxe["reason"], rxe

        # The stack is back: rdmad loads rdma_rxe and re-creates the link.
        g.check("modprobe ib_core", timeout=120)
        g.wait_for("test -e /sys/class/infiniband/rxg0", 120)
        assert [(r["ifname"], r.get("netdev")) for r in g.rdma_links()] == [("rxg0", nic)]
        g.wait_until(
            lambda: json.loads(ctl(g, "status", "--json").out)["daemon"]["pause"] is None,
            timeout=60,
            what="no pause in status",
        )

        # By hand: `rdmad-ctl pause` names its caller; `resume` ends it.
        paused = ctl(g, "pause", "--for", "300", "--reason", "MOFED upgrade", "--json")
        assert paused.rc == 0, paused.describe()
        pause = json.loads(paused.out)["pause"]
        assert pause["by"].startswith("rdmad-ctl pause (uid 0, pid ") and pause["reason"] == (
            "MOFED upgrade"
        ), pause
        assert "PAUSED" in ctl(g, "status").out
        resumed = ctl(g, "resume")
        assert resumed.rc == 0 and "not paused" in resumed.out, resumed.describe()
    except Exception:
        log(f"status: {status(g)}\n{journal(g)[-4000:]}")
        raise
