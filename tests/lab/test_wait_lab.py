"""rdmad-wait-converged.service on a real 6.1 kernel, from the .deb, as a consumer uses it.

A consumer unit (a stand-in for slurmd: `Requires=` and `After=` the wait unit, enabled
for multi-user.target) records what the node has at the moment it starts. After a
reboot the record has the declared VFs with their MAC and the rxe link on the virtio
NIC: systemd started it only once rdmad said converged. Then a config the node cannot
meet (an rxe link on a netdev that does not exist) and a short wait (the unit's own
`RDMAD_WAIT_WITHIN`, from a drop-in): the wait unit fails, its journal names what is
missing, and the consumer does not start.

And `rdmad-ctl wait` right after a change rdmad has no event for: its answer comes
from a pass made after it asked, never from the verdict of the pass before the change;
and a wait under way rides through rdmad being killed and restarted by systemd.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from daemon_proc import (
    main_pid,
    restarts,
    status_doc,
    unit_props,
    wait_converged,
    wait_restarted,
)
from harness import Guest
from service import reload, serving_veth, start, write_config
from test_rxe_persistence import virtio_netdev

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

WAIT_UNIT = "rdmad-wait-converged.service"
CONSUMER = "lab-rdma-consumer.service"
RECORD = "/run/lab-consumer.txt"
DROPIN_DIR = f"/run/systemd/system/{WAIT_UNIT}.d"
NUMVFS = 2
VF0_MAC = "02:00:00:00:0c:00"
MISSING = "labnone0"  # a netdev no one creates


def consumer_unit(pf: str, pf_netdev: str) -> str:
    record = (
        f"echo numvfs=$(cat /sys/bus/pci/devices/{pf}/sriov_numvfs); "
        f"ip link show {pf_netdev}; rdma link show; "
        f"echo wait=$(systemctl is-active {WAIT_UNIT})"
    )
    return f"""[Unit]
Description=lab: a unit that needs RDMA (as slurmd would)
Requires={WAIT_UNIT}
After={WAIT_UNIT}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c {shlex.quote(f"{{ {record}; }} > {RECORD}")}

[Install]
WantedBy=multi-user.target
"""


def config(pf: str, nic: str, *, missing: bool = False) -> str:
    text = (
        f'[[rxe]]\nname = "rxe0"\nnetdev = {{ name = "{nic}" }}\n\n'
        f'[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = {NUMVFS}\n\n'
        f'[[sriov.vf]]\nindex = 0\nmac = "{VF0_MAC}"\n'
    )
    if missing:
        text += f'\n[[rxe]]\nname = "rxe1"\nnetdev = {{ name = "{MISSING}" }}\n'
    return text


@pytest.fixture
def consumer_guest(installed_guest: Guest) -> Guest:
    g = installed_guest
    g.install_rdmad()
    return g


@pytest.mark.lab_needs("reboot")
def test_a_consumer_starts_after_a_reboot_only_once_converged_and_not_when_it_cannot(
    consumer_guest: Guest,
) -> None:
    g = consumer_guest
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]
    nic = virtio_netdev(g)
    write_config(g, config(pf, nic))
    g.check(
        f"cat > /etc/systemd/system/{CONSUMER}",
        stdin=consumer_unit(pf, pf_netdev).encode(),
    )
    # The package enables rdmad, never the wait unit: only the consumer pulls it in.
    assert g.run(f"systemctl is-enabled {WAIT_UNIT}").out.strip() == "static"
    g.check(f"systemctl daemon-reload && systemctl enable rdmad.service {CONSUMER}")

    g.reboot()
    g.wait_for(f"systemctl is-active {CONSUMER}", timeout=240)
    seen = g.check(f"cat {RECORD}")
    assert f"numvfs={NUMVFS}" in seen, seen
    assert re.search(rf"\bvf 0\s+link/ether {VF0_MAC}\b", seen), seen
    assert re.search(rf"^link rxe0/1 state ACTIVE .*\bnetdev {nic}\b", seen, re.M), seen
    assert "wait=active" in seen, seen
    # In systemd's own order: the wait unit was done before the consumer started.
    stamp = "ActiveEnterTimestampMonotonic"
    waited = int(g.check(f"systemctl show -p {stamp} --value {WAIT_UNIT}"))
    began = int(g.check(f"systemctl show -p ExecMainStartTimestampMonotonic --value {CONSUMER}"))
    assert 0 < waited <= began, (waited, began)
    wait_log = g.check(f"journalctl -b -o cat -u {WAIT_UNIT}")
    assert "converged after" in wait_log, wait_log

    # A node that cannot converge: the wait fails in its own time and says why; the
    # consumer that requires it does not start.
    reload(g, config(pf, nic, missing=True))
    g.check(
        f"systemctl stop {CONSUMER} {WAIT_UNIT} && rm -f {RECORD} && mkdir -p {DROPIN_DIR} && "
        f"printf '[Service]\\nEnvironment=RDMAD_WAIT_WITHIN=5\\n' > {DROPIN_DIR}/short.conf && "
        "systemctl daemon-reload"
    )
    res = g.run(f"systemctl start {CONSUMER}", timeout=120)
    assert res.rc != 0 and "dependency" in (res.out + res.err).lower(), res.describe()
    assert g.run(f"systemctl is-failed {WAIT_UNIT}").out.strip() == "failed"
    assert g.run(f"systemctl is-active {CONSUMER}").out.strip() != "active"
    assert not g.run(f"test -e {RECORD}").ok, "the consumer ran"
    invocation = g.check(f"systemctl show -p InvocationID --value {WAIT_UNIT}").strip()
    failed_log = g.check(f"journalctl -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    assert "not converged within 5 s" in failed_log, failed_log
    assert "rxe rxe1" in failed_log and MISSING in failed_log, failed_log


def test_a_wait_is_answered_by_a_pass_made_after_it_asked(consumer_guest: Guest) -> None:
    """sriov_drivers_autoprobe set back to 1 by hand: the kernel sends no event for it
    and the drift check is an hour away, so the last pass's verdict (converged) is
    older than the change. `rdmad-ctl wait` asks for a pass of its own, which finds the
    drift and writes 0 again: when the wait returns, converged, autoprobe is 0."""
    g = consumer_guest
    pf = g.igb_pf()
    autoprobe = f"/sys/bus/pci/devices/{pf}/sriov_drivers_autoprobe"
    start(
        g,
        '[daemon]\ndrift_interval = "1h"\n\n'
        f'[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = {NUMVFS}\nautoprobe = false\n',
    )
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = {NUMVFS} ]", timeout=120)
    wait_converged(g, 120)
    assert g.read(autoprobe).strip() == "0"

    g.check(f"echo 1 > {autoprobe}")
    before = status_doc(g)
    res = g.run(["rdmad-ctl", "wait", "--within", "60", "--json"], timeout=120)
    now = g.read(autoprobe).strip()  # as the wait returned, before anything else
    assert res.rc == 0, res.describe()
    assert now == "0", f"the wait said converged with autoprobe {now}: {res.out}"
    doc = json.loads(res.out)
    assert doc["converged"] is True and doc["answered"] is True, doc
    assert doc["daemon"]["passes"] > before["daemon"]["passes"], (before["daemon"], doc["daemon"])


WAITER_OUT, WAITER_RC = "/run/lab-waiter.out", "/run/lab-waiter.rc"


def test_a_wait_under_way_rides_through_a_restart_of_rdmad(consumer_guest: Guest) -> None:
    """A wait for an rxe link whose netdev does not exist yet; rdmad is killed (SIGKILL:
    a crash) while the wait waits, and systemd's Restart= brings it back; then the
    netdev comes and the restarted rdmad makes the link. The wait ends converged
    (exit 0) instead of failing for the restart (exit 3) a unit ordered after it would
    have failed with."""
    g = consumer_guest
    g.run(f"ip link del labw0 2>/dev/null; rm -f {WAITER_OUT} {WAITER_RC}")
    start(
        g,
        '[daemon]\ndrift_interval = "1h"\n\n[[rxe]]\nname = "rxw0"\nnetdev = { name = "labw0" }\n',
    )
    before = status_doc(g)
    assert before["converged"] is False, before["summary"]
    waiter = g.start_unit(
        "lab-waiter",
        f"rdmad-ctl wait --within 180 > {WAITER_OUT} 2>&1; echo $? > {WAITER_RC}",
        max_seconds=300,
    )
    try:
        # Each ask of the waiter starts a pass, and it asks again only after an answer:
        # two passes more than before mean it has had an answer (nothing else runs one).
        g.wait_until(
            lambda: status_doc(g)["daemon"]["passes"] >= before["daemon"]["passes"] + 2,
            timeout=60,
            interval=0.5,
            what="the waiter answered once and asking again",
        )
        pid, restarted = main_pid(g), restarts(g)
        g.check("systemctl kill -s KILL rdmad.service")
        wait_restarted(g, pid)
        assert restarts(g) > restarted, "rdmad came back, but not through systemd's Restart="
        assert not g.exists(WAITER_RC), g.run(f"cat {WAITER_OUT}").out  # still waiting
        serving_veth(g, "labw0", "labw0p", "10.79.9.1")
        g.wait_until(lambda: g.exists(WAITER_RC), timeout=120, interval=0.5, what="the wait")
        out = g.check(f"cat {WAITER_OUT}")
        assert g.read(WAITER_RC).strip() == "0", out
        assert out.startswith("converged after"), out
        g.check("rdma link show rxw0/1 | grep -q 'netdev labw0'")
    finally:
        g.stop_unit(waiter)
        g.run("ip link del labw0 2>/dev/null; true")


def test_a_wait_under_way_ends_at_once_when_rdmad_is_stopped(consumer_guest: Guest) -> None:
    """The same wait, but `systemctl stop rdmad`: nothing will make the link now, and
    the wait says so at once (exit 3, naming the stopped unit) instead of waiting out
    its --within (180 s). The daemon names its unit in its status; systemd says it is
    inactive with no job queued."""
    g = consumer_guest
    g.run(f"ip link del labw0 2>/dev/null; rm -f {WAITER_OUT} {WAITER_RC}")
    start(
        g,
        '[daemon]\ndrift_interval = "1h"\n\n[[rxe]]\nname = "rxw0"\nnetdev = { name = "labw0" }\n',
    )
    before = status_doc(g)
    assert before["daemon"]["unit"] == "rdmad.service", before["daemon"]
    waiter = g.start_unit(
        "lab-waiter",
        f"rdmad-ctl wait --within 180 > {WAITER_OUT} 2>&1; echo $? > {WAITER_RC}",
        max_seconds=300,
    )
    try:
        g.wait_until(  # as above: it has had an answer and asks again
            lambda: status_doc(g)["daemon"]["passes"] >= before["daemon"]["passes"] + 2,
            timeout=60,
            interval=0.5,
            what="the waiter answered once and asking again",
        )
        assert not g.exists(WAITER_RC), g.run(f"cat {WAITER_OUT}").out
        g.check("systemctl stop rdmad.service", timeout=120)
        # Bounded well inside --within: the waiter looks every 0.5 s while rdmad is down.
        g.wait_until(lambda: g.exists(WAITER_RC), timeout=60, interval=0.5, what="the wait")
        out = g.check(f"cat {WAITER_OUT}")
        assert g.read(WAITER_RC).strip() == "3", out
        assert "rdmad.service was stopped and nothing is starting it again" in out, out
    finally:
        g.stop_unit(waiter)
        g.run("systemctl start rdmad.service", timeout=300)  # as the other tests find it


def test_status_and_a_new_wait_while_systemd_restarts_rdmad(consumer_guest: Guest) -> None:
    """rdmad crashes (SIGKILL) and systemd waits RestartSec= before starting it again (30 s
    here, by a drop-in, so the test sees that state for sure). Meanwhile `rdmad-ctl
    status` says what systemd says (failed, started again shortly, the journal), not
    "start it"; a `rdmad-ctl wait` asked then waits for the restart instead of exiting 3
    at once, and ends converged once rdmad is back."""
    g = consumer_guest
    dropin = "/run/systemd/system/rdmad.service.d/lab-restart-later.conf"
    g.run(f"rm -f {WAITER_OUT} {WAITER_RC}")
    start(g, '[daemon]\ndrift_interval = "1h"\n')
    g.check(
        f"mkdir -p {dropin.rsplit('/', 1)[0]} && printf '[Service]\\nRestartSec=30s\\n' > {dropin}"
        " && systemctl daemon-reload"
    )
    waiter = None
    try:
        pid, restarted = main_pid(g), restarts(g)
        g.check("systemctl kill -s KILL rdmad.service")
        g.wait_until(
            lambda: unit_props(g, "SubState")["SubState"] == "auto-restart",
            timeout=20,
            interval=0.2,
            what="systemd in RestartSec='s wait",
        )
        st = g.run("rdmad-ctl status")
        assert st.returncode == 3, st.out + st.err
        assert "rdmad is not running" in st.err, st.err
        assert "rdmad.service failed (signal) and systemd starts it again shortly" in st.err, st.err
        assert "journalctl -u rdmad.service" in st.err and "systemctl start" not in st.err
        doc = json.loads(g.run("rdmad-ctl status --json").out)
        assert doc["unit"]["systemd"]["SubState"] == "auto-restart", doc["unit"]
        waiter = g.start_unit(
            "lab-waiter",
            f"rdmad-ctl wait --within 180 > {WAITER_OUT} 2>&1; echo $? > {WAITER_RC}",
            max_seconds=300,
        )
        wait_restarted(g, pid)
        assert restarts(g) > restarted
        g.wait_until(lambda: g.exists(WAITER_RC), timeout=120, interval=0.5, what="the wait")
        out = g.check(f"cat {WAITER_OUT}")
        assert g.read(WAITER_RC).strip() == "0", out
        assert out.startswith("converged after"), out
    finally:
        if waiter is not None:
            g.stop_unit(waiter)
        g.run(f"rm -f {dropin}; systemctl daemon-reload")
        g.run("systemctl start rdmad.service", timeout=300)  # as the other tests find it
