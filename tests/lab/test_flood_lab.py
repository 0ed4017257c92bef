"""Issue 42, item 7 on the lab's 6.1 kernel: local users cannot exhaust rdmad.

rdmad installed from the .deb with its unit, the TCP metrics listener on
127.0.0.1:9478 (the packaged metrics-tcp.conf drop-in), an rxe link declared on a veth
end. Then, as an operator's unprivileged users would:

* two processes as ``nobody`` each hold 600 idle TCP connections to the metrics
  listener, opening again every 10 s what rdmad closed (refused at once, or idle 5 s);
* a member of the ``rdmad`` group (the socket's read group) holds 200 connections to
  the API socket the same way;

and meanwhile root's `rdmad-ctl status` answers within its timeout (5 s) every time,
and the declared rxe link, deleted during the flood, comes back. The daemon keeps to
its descriptor limit (LimitNOFILE=4096: never near it) and logs no "Too many open
files". Figures go to tests/RELIABILITY.md.

(Before: 1,143 such TCP connections took every descriptor rdmad had under systemd's
default limit of 1024; its /proc listing failed with EMFILE every second, asyncio
logged "accept() out of system resource" in a loop and root's status timed out.)
"""

from __future__ import annotations

import json
import shlex
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from harness import Guest, GuestTimeout, log
from service import ctl, journal, start

# Alone: its answer times need the host's cores, not one shared with another guest (workers.py).
pytestmark = [pytest.mark.lab, pytest.mark.lab_alone, pytest.mark.timeout(1200)]

PORT = 9478
RXE, VETH, PEER = "rxfl0", "labfl0", "labfl1"
FLOODER = "labflood"  # a member of the rdmad group: may read the API socket
SCRIPT = "/run/lab-flood.py"
DROPIN = "/etc/systemd/system/rdmad.service.d/metrics-tcp.conf"
HOLD = 150  # seconds each flood keeps going at most: the test ends them once measured
TCP_EACH, UNIX_N = 600, 200
CTL_TIMEOUT = 5.0  # rdmad-ctl's default --timeout
FLOOD_SRC = Path(__file__).resolve().parents[1] / "support" / "flood_client.py"

CONFIG = f"""\
[daemon]
drift_interval = "1h"

[metrics]
listen = "127.0.0.1:{PORT}"

[[rxe]]
name = "{RXE}"
netdev = {{ name = "{VETH}" }}
"""


@pytest.fixture
def rdmad(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    guest.run("rm -rf /etc/rdmad /var/lib/rdmad")
    return guest


def flood(g: Guest, name: str, user: str, target: str, address: str, n: int) -> str:
    """A flood_client.py run as ``user`` in a transient unit, its JSON lines in a file."""
    out = f"/run/lab-flood-{name}.json"
    g.check(
        f"systemd-run --quiet --collect --unit=lab-flood-{name} -p User={user} "
        f"-p RuntimeMaxSec={HOLD + 120} -p StandardOutput=file:{out} "
        f"/usr/bin/python3 -I {SCRIPT} {target} {shlex.quote(address)} -n {n} "
        f"--hold {HOLD} --every 10"
    )
    return out


def lines(g: Guest, out: str) -> list[dict[str, Any]]:
    res = g.run(f"cat {out}")
    return [json.loads(line) for line in res.out.splitlines() if line.strip()] if res.ok else []


def latest(g: Guest, out: str, phase: str) -> dict[str, Any] | None:
    """A flood's last line of ``phase`` (round: its counts so far; report: its end)."""
    return next((line for line in reversed(lines(g, out)) if line["phase"] == phase), None)


def held_to_their_bounds(g: Guest, outs: list[str]) -> bool:
    """Every flood's last round shows everything past the listeners' bounds refused: 32
    TCP connections at once from both TCP floods together, 32 from the group member
    (the bounds the test asserts on the final reports)."""
    rounds = [r for out in outs if (r := latest(g, out, "round")) is not None]
    if len(rounds) < len(outs):
        return False
    tcp, unix = rounds[:2], rounds[2]
    return sum(r["refused"] for r in tcp) >= 2 * TCP_EACH - 32 and unix["refused"] >= UNIX_N - 32


def ended(g: Guest, outs: list[str]) -> bool:
    """Every flood has reported; else SIGUSR1 to those still running, again each poll.
    Seen once in CI: one flood never reported after a single signal (the guest busy),
    and it would have ended on its own only past this wait. A second signal is harmless:
    once a flood's hold is over, its handler does nothing."""
    if all(latest(g, out, "report") for out in outs):
        return True
    g.run("systemctl kill --signal=SIGUSR1 'lab-flood-*.service'")
    return False


def floods_state(g: Guest, outs: list[str]) -> str:
    """What a failed wait needs: each flood unit's state, its log, its last lines."""
    tails = " ".join(f"echo == {out}; tail -c 600 {out};" for out in outs)
    return g.run(
        "systemctl status --no-pager 'lab-flood-*.service'; "
        "journalctl --no-pager -o short-monotonic -u 'lab-flood-*' | tail -40; " + tails,
        timeout=60,
    ).out


# Root's request alone, timed from after the interpreter started: rdmad-ctl's own
# start-up (a second under TCG) competes with the floods for the guest's two CPUs.
PROBE = "/run/lab-probe.py"
# Like rdmad-ctl, it waits for room in a full backlog in the kernel (a blocking connect
# within SO_SNDTIMEO): with settimeout first, the connect would fail at once with EAGAIN.
PROBE_SRC = """\
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", 5, 0))
t0 = time.monotonic()
s.connect("/run/rdmad/rdmad.sock")
s.settimeout(5.0)
s.sendall(b"GET /v1/status HTTP/1.1\\r\\nHost: rdmad\\r\\nConnection: close\\r\\n\\r\\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
assert data.startswith(b"HTTP/1.1 200 "), data[:100]
print(time.monotonic() - t0)
"""


def root_status(g: Guest) -> tuple[int, float, float, str]:
    """`rdmad-ctl status` as root: (its exit code, the seconds the whole command took,
    the seconds root's request alone took, on the guest's clock; what it wrote to
    stderr: only a failed request writes there, a timeout among them)."""
    out = g.check(
        "t0=$(date +%s.%N); rdmad-ctl status >/dev/null 2>/tmp/lab-status.err; rc=$?; "
        f"t1=$(date +%s.%N); echo $rc $t0 $t1 $(python3 -I {PROBE}); cat /tmp/lab-status.err",
        timeout=60,
    )
    first, _, err = out.partition("\n")
    rc, t0, t1, request = first.split()
    return int(rc), float(t1) - float(t0), float(request), err.strip()


def rdmad_fds(g: Guest) -> int:
    return int(g.check("ls /proc/$(systemctl show -p MainPID --value rdmad)/fd | wc -l").strip())


def restored_after_delete(g: Guest) -> float:
    """`rdma link delete RXE`, then seconds (guest clock) until rdmad has it back."""
    script = f"""set -e
rdma link delete {RXE}
t0=$(date +%s.%N)
n=0
while [ ! -e /sys/class/infiniband/{RXE} ]; do
  n=$((n + 1)); [ "$n" -lt 3000 ] || {{ echo "{RXE} not back after 30 s" >&2; exit 1; }}
  sleep 0.01
done
t1=$(date +%s.%N)
echo "$t0 $t1"
"""
    t0, t1 = g.check(script, timeout=120).split()
    return float(t1) - float(t0)


def test_a_local_flood_leaves_root_its_status_and_the_rxe_link_restored(rdmad: Guest) -> None:
    g = rdmad
    g.check(
        f"ip link add {VETH} type veth peer name {PEER} && ip link set {VETH} up && "
        f"ip link set {PEER} up && ip addr add 10.79.2.1/32 dev {VETH}"  # a link that can serve
    )
    g.check(
        f"mkdir -p {Path(DROPIN).parent} && ln -sf /usr/share/rdmad/metrics-tcp.conf {DROPIN} && "
        "systemctl daemon-reload"
    )
    start(g, CONFIG)
    g.wait_for(f"test -e /sys/class/infiniband/{RXE}", 60)
    scrape = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{PORT}/metrics', timeout=5)"
    g.check(f"python3 -c {shlex.quote(scrape)}", timeout=60)
    pid = g.check("systemctl show -p MainPID --value rdmad").strip()
    limits = g.check(f"grep 'Max open files' /proc/{pid}/limits").split()
    assert limits[3:5] == ["4096", "4096"], limits  # LimitNOFILE= of the unit
    g.check(f"id {FLOODER} >/dev/null 2>&1 || useradd --system --no-create-home -G rdmad {FLOODER}")
    g.check(f"cat > {SCRIPT} && chmod 0644 {SCRIPT}", stdin=FLOOD_SRC.read_bytes())
    g.check(f"cat > {PROBE}", stdin=PROBE_SRC.encode())
    baseline = [root_status(g) for _ in range(3)]
    fds_before = rdmad_fds(g)
    socket = "/run/rdmad/rdmad.sock"

    outs = [
        flood(g, "tcp1", "nobody", "tcp", f"127.0.0.1:{PORT}", TCP_EACH),
        flood(g, "tcp2", "nobody", "tcp", f"127.0.0.1:{PORT}", TCP_EACH),
        flood(g, "unix", FLOODER, "unix", socket, UNIX_N),
    ]
    started = time.monotonic()
    try:
        g.wait_until(
            lambda: all(lines(g, out) for out in outs), timeout=120, what="the floods' first round"
        )
        during = []
        fds_during = []
        for _ in range(6):
            during.append(root_status(g))
            fds_during.append(rdmad_fds(g))
        restored = restored_after_delete(g)
        during += [root_status(g) for _ in range(3)]
        still_flooding = time.monotonic() - started < HOLD
        assert still_flooding, "the measurements outlasted the flood"
        # Measured: the floods go on only until their rounds show every connection past
        # the bounds refused (or HOLD ends them), then end (SIGUSR1: each stops
        # reopening and reports) rather than waiting out the rest of HOLD.
        with suppress(GuestTimeout):  # not within HOLD: the assertions below say by how much
            g.wait_until(
                lambda: held_to_their_bounds(g, outs),
                timeout=max(1.0, HOLD - (time.monotonic() - started)),
                interval=2.0,
                what="the floods' refusals",
            )
        g.wait_until(lambda: ended(g, outs), timeout=120, interval=1.0, what="the floods' reports")
    except Exception:
        log(f"rdmad's log:\n{journal(g)[-6000:]}")
        log(f"the floods:\n{floods_state(g, outs)}")
        raise
    reports = {out: latest(g, out, "report") for out in outs}
    log(f"flood: baseline {baseline}, during {during}, rxe back in {restored:.3f} s")
    log(f"flood: rdmad fds {fds_before} before, {fds_during} during; reports {reports}")

    # Root answered every time, within rdmad-ctl's own timeout (on the request: a
    # timeout exits 1 like "not converged", but writes its error to stderr). The whole
    # command's time is logged, not asserted: under TCG, most of it is the interpreter
    # starting while the floods hold the guest's CPUs, not rdmad answering (seen: 5.3 s
    # for a command whose request took 0.07 s).
    assert all(rc in (0, 1) and not err for rc, _, _, err in during), during
    assert max(request for _, _, request, _ in during) < CTL_TIMEOUT, during
    assert restored < 30.0
    # The floods were held to their bounds: 32 TCP connections at once from both
    # processes together, 32 from the group member; everything past was refused.
    tcp = [reports[outs[0]], reports[outs[1]]]
    unix = reports[outs[2]]
    assert sum(r["refused"] for r in tcp) >= 2 * TCP_EACH - 32, tcp
    assert unix["refused"] >= UNIX_N - 32, unix
    assert max(fds_during) < 4096 // 4 + fds_before, fds_during
    logged = journal(g)
    assert "Too many open files" not in logged
    assert "out of system resource" not in logged
    refusals = logged.count("api.connections-refused")
    assert 1 <= refusals <= 2 * (HOLD // 60 + 2), refusals  # a line a minute per listener
    status = ctl(g, "status", "--json")
    doc = json.loads(status.out)
    rxe = next(o for o in doc["objects"] if o["obj"] == f"rxe {RXE}")
    assert rxe["state"] == "converged", rxe
