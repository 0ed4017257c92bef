"""rdmad's drop-in for MOFED/DOCA's openibd.service on the lab's real systemd.

The guest has no MOFED: a stand-in openibd.service in /etc/systemd/system whose own
stop leaves a mark (what the drop-in must run after the guard's check). rdmad runs as
the packaged unit (its sandbox included, which must still let it tell systemd):

* a PF declared (its driver_guard on by default): rdmad writes the runtime drop-in and
  systemd has read it (`systemctl show -p ExecStop` lists the guard's check, then the
  unit's own command);
* a VF of that PF held open through vfio-pci: the guard refuses the stop, so the unit's
  own stop never runs, igb and the VFs are untouched, and the unit ends failed with the
  guard's words in its journal (`systemctl stop` itself exits 0: a stop job is done
  once the unit is down, whatever its ExecStop= said);
* the holder gone: the stop goes through and runs the unit's own command;
* nothing declared any more: the drop-in is gone and systemd stops openibd as the unit
  says, without asking the guard.
"""

from __future__ import annotations

import pytest
from harness import Guest
from service import reload, start

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

UNIT = "/etc/systemd/system/openibd.service"
DROPIN = "/run/systemd/system/openibd.service.d/rdmad-guard.conf"
MARK = "/run/lab-openibd-stopped"
UNIT_TEXT = f"""[Unit]
Description=lab stand-in for MOFED's openibd (its stop leaves {MARK})

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
ExecStop=/usr/bin/touch {MARK}
"""


def config(pf: str) -> str:
    return f'[daemon]\ndrift_interval = "2s"\n\n[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = 2\n'


def exec_stop(g: Guest) -> str:
    """openibd's ExecStop= as systemd has it loaded (not as the files say)."""
    return g.check("systemctl show -p ExecStop --value openibd.service")


@pytest.fixture
def node(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    # The RDMA core loaded, as on a MOFED node: a stack stop that leaves it loaded (the
    # stand-in unloads nothing) ends the pause the guard began (ExecStopPost=).
    guest.check("modprobe ib_core")
    guest.check(f"cat > {UNIT}", stdin=UNIT_TEXT.encode())
    guest.check("systemctl daemon-reload && systemctl start openibd.service", timeout=120)
    return guest


def test_openibd_stop_asks_the_guard_then_runs_the_units_own_stop(node: Guest) -> None:
    g = node
    pf = g.igb_pf()
    start(g, config(pf))
    g.wait_for(f"[ $(cat {g.pci_path(pf, 'sriov_numvfs')}) = 2 ]", timeout=120)
    g.wait_for(f"test -s {DROPIN}", timeout=60)
    g.wait_until(
        lambda: "stack-stop" in exec_stop(g), timeout=60, what="systemd reading the drop-in"
    )
    loaded = exec_stop(g)
    # The guard's check first, then the unit's own stop: nothing else.
    assert loaded.index("stack-stop") < loaded.index(f"/usr/bin/touch {MARK}"), loaded
    assert loaded.count("path=") == 2, loaded  # two commands: the check, the unit's

    # A VF in use: the stop is refused before the unit's own command runs.
    vf1 = g.vf_bdfs(pf)[1]
    group = g.bind_vfio(vf1)
    unit, pid = g.hold_open(f"/dev/vfio/{group}")
    try:
        g.check("systemctl stop openibd.service", timeout=120)
        assert g.check("systemctl show -p Result --value openibd.service").strip() == "exit-code"
        assert not g.exists(MARK)
        assert g.module_loaded("igb") and g.numvfs(pf) == 2
        said = g.check("journalctl -b -u openibd.service --no-pager -o cat", timeout=60)
        assert f"pid {pid} (sleep)" in said, said
    finally:
        g.stop_unit(unit)

    # The holder gone: allowed, and what the unit itself runs at stop has run.
    g.check("systemctl reset-failed openibd.service; systemctl start openibd.service")
    g.check("systemctl stop openibd.service", timeout=120)
    assert g.exists(MARK)

    # Nothing guarded: the drop-in goes, and openibd stops as its unit says.
    g.check(f"rm -f {MARK} && systemctl start openibd.service")
    reload(g, '[daemon]\ndrift_interval = "2s"\n')
    g.wait_for(f"! test -e {DROPIN}", timeout=60)
    g.wait_until(lambda: "stack-stop" not in exec_stop(g), timeout=60, what="systemd forgetting it")
    g.check("systemctl stop openibd.service", timeout=120)
    assert g.exists(MARK)
