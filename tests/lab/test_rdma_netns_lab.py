"""[rdma] netns_mode on the lab's kernel: the RDMA subsystem's namespace mode, declared.

rdmad (the package, under systemd) sets the running kernel's mode and writes ib_core's
modprobe.d option. Each step reads the kernel back (``/sys/module/ib_core/parameters/
netns_mode``: Y shared, N exclusive, and `rdma system show`, what an operator reads):

* declared exclusive on a node in the kernel's default (shared): set, option written;
* set back to shared by hand: restored by rdmad (its drift check; nothing else tells);
* a network namespace with a process in it: the change is blocked (the kernel would
  answer EBUSY) and status names the namespace and the process; once the namespace is
  gone, the change follows;
* the RDMA stack reloaded and the node rebooted: ib_core comes up exclusive from the
  option, before any namespace exists.
"""

from __future__ import annotations

import pytest
from harness import Guest
from service import ctl_status, start

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

PARAM = "/sys/module/ib_core/parameters/netns_mode"
OPTION = "/etc/modprobe.d/rdmad-ib-core.conf"
CONFIG = '[daemon]\ndrift_interval = "2s"\n\n[rdma]\nnetns_mode = "exclusive"\n'
NS = "labnsb"
# Unload ib_core: its holders first (rdma-core's udev rules load some: rdma_ucm, ib_umad,
# ib_ipoib...), a few rounds for the holders of holders, then ib_core itself.
UNLOAD_STACK = (
    "for round in 1 2 3 4 5; do for m in $(ls /sys/module/ib_core/holders 2>/dev/null); "
    "do modprobe -r $m 2>/dev/null; done; done; modprobe -r ib_core"
)


def is_mode(flag: str) -> str:
    """Shell condition: ib_core is loaded and its netns_mode reads FLAG (Y or N)."""
    return f'[ "$(cat {PARAM} 2>/dev/null)" = {flag} ]'


def rdma_object(g: Guest) -> dict[str, object]:
    _, doc = ctl_status(g)
    return next(o for o in doc["objects"] if o["obj"] == "rdma")


@pytest.mark.lab_needs("reboot")
def test_netns_mode_set_restored_blocked_and_kept_across_reload_and_reboot(
    installed_guest: Guest,
) -> None:
    g = installed_guest
    assert g.install_rdmad().unit_installed
    g.check("modprobe rdma_rxe", timeout=120)  # ib_core with it, in the default mode
    assert g.run(is_mode("Y")).ok

    # --- declared: set in the running kernel, and the option written -------------------
    start(g, CONFIG)
    g.wait_for(is_mode("N"), timeout=60)
    assert "netns exclusive" in g.check("rdma system show")
    assert g.check(f"cat {OPTION}").strip().endswith("options ib_core netns_mode=0")
    g.wait_until(lambda: rdma_object(g)["state"] == "converged", timeout=60, what="rdma converged")

    # --- changed by hand: restored -------------------------------------------------------
    g.check("rdma system set netns shared")
    g.wait_for(is_mode("N"), timeout=60)

    # --- a namespace in the way: blocked, naming it; then it follows ---------------------
    g.check("systemctl stop rdmad.service")
    g.check("rdma system set netns shared")
    g.check(f"ip netns add {NS}")
    holder = g.start_unit("lab-netns-holder", f"exec ip netns exec {NS} sleep 900")
    g.wait_for("pgrep -f '^sleep 900$' >/dev/null", timeout=60)
    pid = g.check("pgrep -f '^sleep 900$'").strip()
    g.check("systemctl start rdmad.service", timeout=300)
    g.wait_until(lambda: rdma_object(g)["state"] == "blocked", timeout=60, what="rdma blocked")
    reason = str(rdma_object(g)["reason"])
    assert f"'{NS}' (ip netns): pid {pid} (sleep)" in reason, reason
    assert g.run(is_mode("Y")).ok  # untouched
    g.stop_unit(holder)
    g.check(f"ip netns del {NS}")
    g.wait_for(is_mode("N"), timeout=60)

    # --- the RDMA stack reloaded (rdmad stopped: nothing of its doing) --------------------
    g.check("systemctl stop rdmad.service")
    unloaded = g.run(UNLOAD_STACK, timeout=240)
    assert not g.exists("/sys/module/ib_core"), unloaded.describe() + g.check("lsmod")
    g.check("modprobe rdma_rxe", timeout=120)
    assert g.run(is_mode("N")).ok  # from the first moment: the option

    # --- reboot: the same, and rdmad (enabled) says it converged -------------------------
    g.check("systemctl enable rdmad.service")
    g.reboot()
    g.check("modprobe rdma_rxe", timeout=120)
    assert g.run(is_mode("N")).ok
    g.wait_until(lambda: rdma_object(g)["state"] == "converged", timeout=120, what="rdma converged")
