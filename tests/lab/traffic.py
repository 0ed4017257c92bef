"""Real consumers of two rxe links in one lab guest: rdma_cm (rping) and RC verbs traffic.

A link rdmad restored counts when what RDMA users run works across it, not when
`rdma link` lists it. Two rxe links on the two ends of one veth pair are the smallest
such setup on the 6.1 guest, with routing help (shared/LAB.md): rxe drops packets that
arrive on `lo`, and traffic between two local addresses takes `lo` unless

* each end has its own address (/32), and per-direction rules for locally generated
  packets (`iif lo`) send A -> B out of end A and B -> A out of end B,
* the same rules keyed by the outgoing device (`oif`): rdma_cm's passive side checks
  that the route back to a connection request's source leaves through the netdev the
  request came in on (a lookup with `oif` set and no `iif`), and rejects the request
  (REJ, consumer-defined reason 28) when it does not; without an explicit source
  (`rping -I`) the route to a local address is `lo`, and rxe loops the traffic inside
  one device without crossing the pair,
* the `local` table is looked up after those rules (its rule moved from preference 0),
* both ends accept packets from a local source (`accept_local=1`, `rp_filter=0`).

`PAIR_SCRIPT` sets that up (idempotent); a reboot test installs it as a boot unit, since
the kernel keeps none of it across a reboot. `check_traffic()` then proves both kinds of
traffic really crossed the pair: rping (an rdma_cm connection, RDMA READ/WRITE of its
ping data, `-C` rounds each checked with `-V`) and ibv_rc_pingpong (RC send/recv over
the RoCE v2 GID of each end's address), with the rxe hardware counters and the veth
packet counters read before and after.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import Guest, log

# Names and addresses private to these tests (tests/lab/harness.py resets `lab*` units).
END_A, END_B = "labcm0", "labcm1"
ADDR_A, ADDR_B = "10.77.0.1", "10.77.0.2"
RXE_A, RXE_B = "rxcm0", "rxcm1"
TABLE_A, TABLE_B = 1770, 1771

PAIR_SCRIPT = f"""set -e
ip link show {END_A} >/dev/null 2>&1 || ip link add {END_A} type veth peer name {END_B}
for dev in {END_A} {END_B} all; do
  sysctl -qw net.ipv4.conf.$dev.accept_local=1 net.ipv4.conf.$dev.rp_filter=0
done
ip addr replace {ADDR_A}/32 dev {END_A}
ip addr replace {ADDR_B}/32 dev {END_B}
ip link set {END_A} up
ip link set {END_B} up
ip route replace {ADDR_B}/32 dev {END_A} src {ADDR_A} table {TABLE_A}
ip route replace {ADDR_A}/32 dev {END_B} src {ADDR_B} table {TABLE_B}
rule() {{ pref=$1; shift; ip rule show pref $pref | grep -q . || ip rule add pref $pref "$@"; }}
rule 100 from {ADDR_A} to {ADDR_B} iif lo table {TABLE_A}
rule 101 from {ADDR_B} to {ADDR_A} iif lo table {TABLE_B}
rule 102 from {ADDR_A} to {ADDR_B} oif {END_A} table {TABLE_A}
rule 103 from {ADDR_B} to {ADDR_A} oif {END_B} table {TABLE_B}
rule 1000 table local
ip rule del pref 0 table local 2>/dev/null || true
"""

# Undo what PAIR_SCRIPT did, leaving the guest's routing as it was (shared guest).
UNDO_SCRIPT = f"""ip rule add pref 0 table local 2>/dev/null
for pref in 1000 100 101 102 103; do ip rule del pref $pref 2>/dev/null; done
ip route flush table {TABLE_A} 2>/dev/null; ip route flush table {TABLE_B} 2>/dev/null
ip link del {END_A} 2>/dev/null; true
"""

PAIR_UNIT = "lab-cmpair.service"


def rxe_config() -> str:
    """The two [[rxe]] objects rdmad is asked to keep: one per veth end, by name."""
    return "".join(
        f'[[rxe]]\nname = "{rxe}"\nnetdev = {{ name = "{end}" }}\n\n'
        for rxe, end in ((RXE_A, END_A), (RXE_B, END_B))
    )


def make_pair(g: Guest) -> None:
    g.check(PAIR_SCRIPT)


def remove_pair(g: Guest) -> None:
    g.run(UNDO_SCRIPT, timeout=60)


def install_pair_at_boot(g: Guest) -> None:
    """A oneshot unit that makes the pair at every boot, as a node's network config would."""
    script = "/usr/local/sbin/lab-cmpair"
    unit = f"""[Unit]
Description=lab: the veth pair and routing the rdma_cm tests use
After=systemd-udevd.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh {script}
[Install]
WantedBy=multi-user.target
"""
    g.check(f"cat > {script}", stdin=PAIR_SCRIPT.encode())
    g.check(f"cat > /etc/systemd/system/{PAIR_UNIT}", stdin=unit.encode())
    g.check(f"systemctl daemon-reload && systemctl enable --now {PAIR_UNIT}", timeout=120)


def links_ready(g: Guest, timeout: float = 60.0) -> None:
    """Both links exist on their ends, their ports are ACTIVE and carry their address's GID."""
    for rxe, end, addr in ((RXE_A, END_A, ADDR_A), (RXE_B, END_B, ADDR_B)):
        g.wait_for(
            f"rdma link show {rxe}/1 2>/dev/null | grep -q 'state ACTIVE .*netdev {end}'",
            timeout=timeout,
        )
        g.wait_for(f"grep -qx '{v4_gid(addr)}' /sys/class/infiniband/{rxe}/ports/1/gids/*", 30)


def v4_gid(addr: str) -> str:
    """The RoCE v2 GID the kernel derives from an IPv4 address, as sysfs prints it."""
    a, b, c, d = (int(x) for x in addr.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gid_index(g: Guest, rxe: str, addr: str) -> int:
    """The index of addr's GID in rxe's table (usually 1: 0 is the link-local one)."""
    out = g.check(
        f"cd /sys/class/infiniband/{rxe}/ports/1/gids && grep -lx '{v4_gid(addr)}' *"
    ).split()
    return int(out[0])


@dataclass(frozen=True)
class Counters:
    """rxe hardware counters and veth packet counters, to prove traffic crossed the pair."""

    sent_a: int
    rcvd_b: int
    tx_a: int
    rx_b: int

    @staticmethod
    def read(g: Guest) -> Counters:
        def num(path: str) -> int:
            return int(g.read(path))

        return Counters(
            sent_a=num(f"/sys/class/infiniband/{RXE_A}/ports/1/hw_counters/sent_pkts"),
            rcvd_b=num(f"/sys/class/infiniband/{RXE_B}/ports/1/hw_counters/rcvd_pkts"),
            tx_a=num(f"/sys/class/net/{END_A}/statistics/tx_packets"),
            rx_b=num(f"/sys/class/net/{END_B}/statistics/rx_packets"),
        )


RPING_ROUNDS = 5

# rping's last line on stderr when it lost its own teardown race: its CM thread blocks
# reading the event channel that the main thread then destroys, and, if main gets there
# before the process exits, the read fails with EBADF and rping exits 255 after a run
# that succeeded. rdma-core fixed it in 2025 (its pull request 1622: an eventfd tells
# the thread to stop); Debian 12's rdma-core 44 has the race.
TEARDOWN_RACE = "rdma_get_cm_event: Bad file descriptor"
# What else an rping client may say on stderr in a run that succeeded.
_CLIENT_NOISE = frozenset({"client DISCONNECT EVENT..."})


def rping_verdict(rc: int, out: str, err: str) -> str | None:
    """None when the rping client's run succeeded, TEARDOWN_RACE when it did and then lost
    the race above, otherwise what went wrong.

    The race is forgiven only when every round's ping data came back (with ``-V`` a
    round whose data differs prints "data mismatch!" and none of its own line) and the
    race's message, last, is all rping said besides its disconnect notice.
    """
    rounds = [line for line in out.splitlines() if line.startswith("ping data: rdma-ping-")]
    if len(rounds) != RPING_ROUNDS:
        return f"{len(rounds)} of {RPING_ROUNDS} rounds came back verified"
    if rc == 0:
        return None
    said = [line.strip() for line in err.splitlines() if line.strip()]
    if rc == 255 and said[-1:] == [TEARDOWN_RACE] and set(said[:-1]) <= _CLIENT_NOISE:
        return TEARDOWN_RACE
    return f"exit status {rc}"


PINGPONG_ITERS = 50


@dataclass(frozen=True)
class Traffic:
    rping: str
    pingpong: str


def rdma_cm_traffic(g: Guest, timeout: float = 90.0) -> str:
    """rping server on end B's address, client from end A's: connect, RDMA data, verify."""
    server = g.start_unit(
        "lab-rping-server",
        f"exec rping -s -a {ADDR_B} -C {RPING_ROUNDS} -v",
        max_seconds=int(timeout) + 60,
    )
    try:
        g.wait_for("rdma res show cm_id 2>/dev/null | grep -q 'state LISTEN'", timeout=30)
        res = g.run(
            f"timeout -k 5 {timeout:.0f} rping -c -a {ADDR_B} -I {ADDR_A} -C {RPING_ROUNDS} -v -V",
            timeout=timeout + 60,
        )
        verdict = rping_verdict(res.rc, res.out, res.err)
        if verdict is not None and verdict != TEARDOWN_RACE:
            cm = g.run("rdma res show cm_id; rdma res show qp").out
            raise AssertionError(
                f"rdma_cm (rping) from {ADDR_A} to {ADDR_B} failed ({verdict}): "
                f"{res.describe()}\nrdma res show cm_id / qp:\n{cm}"
            )
        if verdict == TEARDOWN_RACE:
            log(f"rping: every round crossed and was verified; then {TEARDOWN_RACE} (rc 255)")
        return res.out
    finally:
        g.stop_unit(server)


def verbs_traffic(g: Guest, timeout: float = 90.0) -> str:
    """ibv_rc_pingpong between the two links over their IPv4 GIDs (RC send/recv)."""
    gid_b = gid_index(g, RXE_B, ADDR_B)
    gid_a = gid_index(g, RXE_A, ADDR_A)
    port = 18515 + 7
    server = g.start_unit(
        "lab-pingpong-server",
        f"exec ibv_rc_pingpong -d {RXE_B} -g {gid_b} -p {port} -n {PINGPONG_ITERS}",
        max_seconds=int(timeout) + 60,
    )
    try:
        g.wait_for(f"ss -ltn | grep -q ':{port} '", timeout=30)
        res = g.run(
            f"timeout -k 5 {timeout:.0f} ibv_rc_pingpong -d {RXE_A} -g {gid_a} -p {port} "
            f"-n {PINGPONG_ITERS} 127.0.0.1",
            timeout=timeout + 60,
        )
        assert res.ok, f"ibv_rc_pingpong {RXE_A} -> {RXE_B} failed: {res.describe()}"
        assert f"{PINGPONG_ITERS} iters in" in res.out, res.describe()
        return res.out
    finally:
        g.stop_unit(server)


def check_traffic(g: Guest, when: str) -> Traffic:
    """rdma_cm and RC verbs traffic across the two rdmad-made links, proven by counters."""
    links_ready(g)
    before = Counters.read(g)
    rping = rdma_cm_traffic(g)
    pingpong = verbs_traffic(g)
    after = Counters.read(g)
    # Each rping round and each pingpong iteration is at least one packet each way;
    # the counters prove the packets went out of end A's rxe and veth and into B's.
    least = RPING_ROUNDS + PINGPONG_ITERS
    assert after.sent_a - before.sent_a >= least, (when, before, after)
    assert after.rcvd_b - before.rcvd_b >= least, (when, before, after)
    assert after.tx_a - before.tx_a >= least, (when, before, after)
    assert after.rx_b - before.rx_b >= least, (when, before, after)
    log(
        f"traffic {when}: rping {RPING_ROUNDS} rounds, ibv_rc_pingpong {PINGPONG_ITERS} iters; "
        f"{RXE_A} sent {after.sent_a - before.sent_a} pkts, {END_B} rx "
        f"{after.rx_b - before.rx_b}"
    )
    return Traffic(rping, pingpong)
