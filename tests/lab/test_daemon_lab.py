"""rdmad under systemd in the guest: READY, STATUS, reacting to the kernel, SIGHUP reload, stop."""

from __future__ import annotations

import pytest
from harness import Guest
from service import journal, serving_veth, write_config

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

CONFIG = """\
[daemon]
settle = "150ms"

[[rxe]]
name = "rxe0"
netdev = { name = "labd0" }
"""


def _show(guest: Guest, prop: str) -> str:
    return guest.check(f"systemctl show -p {prop} --value rdmad.service").strip()


@pytest.fixture
def daemon_guest(guest: Guest) -> Guest:
    report = guest.install_rdmad()
    assert report.unit_installed, "systemd/rdmad.service was not installed"
    serving_veth(guest, "labd0", "labd1", "10.79.0.1")
    write_config(guest, CONFIG)
    return guest


def test_daemon_ready_status_reload_and_stop(daemon_guest: Guest) -> None:
    g = daemon_guest
    # Type=notify: `systemctl start` returns only after READY=1.
    g.check("systemctl start rdmad.service", timeout=300)
    assert _show(g, "ActiveState") == "active"
    status = _show(g, "StatusText")
    assert "1 object(s), 1 converged" in status, status
    links = {(lk["ifname"], lk.get("netdev")) for lk in g.rdma_links()}
    assert ("rxe0", "labd0") in links

    # The kernel loses the link: an event brings it back (the daemon is already running).
    g.check("rdma link delete rxe0")
    g.wait_for("rdma link show | grep -q 'rxe0/1 .*netdev labd0'", timeout=30)

    # `systemctl reload` over a broken config fails, saying why (the unit checks the
    # config first, as `nginx -t`); the daemon never heard of it: still as it was.
    write_config(g, CONFIG + "\n[[sriov]]\nnumvfs = -1\n")
    refused = g.run("systemctl reload rdmad.service", timeout=120)
    assert refused.rc != 0, refused.describe()
    assert "config invalid" not in _show(g, "StatusText")
    g.wait_until(
        lambda: "sriov[0]" in g.run("journalctl -b -u rdmad.service --no-pager -o cat").out,
        timeout=30,
        what="check-config's errors in the unit's journal",
    )

    # SIGHUP by hand with the broken config: last good kept, errors in STATUS and the
    # journal.
    g.check("systemctl kill -s HUP --kill-whom=main rdmad.service")
    g.wait_for(
        "systemctl show -p StatusText --value rdmad.service | grep -q 'config invalid'", timeout=60
    )
    assert _show(g, "ActiveState") == "active"
    # journald stores the lines on its own schedule, after STATUS= may have changed.
    g.wait_until(
        lambda: any("config.invalid" in ln and "sriov[0]" in ln for ln in journal(g).splitlines()),
        timeout=30,
        what="config.invalid naming sriov[0] in rdmad's journal",
    )
    assert "rxe0" in {lk["ifname"] for lk in g.rdma_links()}

    # A good config again clears the errors.
    write_config(g, CONFIG)
    g.check("systemctl reload rdmad.service")
    g.wait_for(
        "! systemctl show -p StatusText --value rdmad.service | grep -q 'config invalid'",
        timeout=60,
    )

    # Journald-friendly: no timestamp of our own on the lines.
    assert "timestamp=" not in journal(g)

    # SIGTERM: clean exit 0, state written.
    g.check("systemctl stop rdmad.service", timeout=360)
    assert _show(g, "Result") == "success"
    assert _show(g, "ExecMainStatus") == "0"
    state = g.json("cat /var/lib/rdmad/state.json")
    assert "rxe0" in state["managed_rxe"]
