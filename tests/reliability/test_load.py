"""Load on this host's real kernel: the daemon process in a network namespace the test
creates, under a 10,000-uevent storm (veth pairs added and deleted), 1,000 link flaps
(RTM_NEWLINK down/up) and 100 concurrent API clients during the storm.

Asserted: passes bounded (events coalesce), RSS bounded, file descriptors and threads
back where they were (no event source or client left behind), the daemon converged
afterwards (a reconcile requested after the storm is answered and the objects are as
before). The uevents are counted by an independent netlink listener in the same
namespace. Figures are printed for tests/RELIABILITY.md; nothing is timed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_daemon_process import Systemd, api_get
from tests.reliability.conftest import root_only
from tests.support.netns import owned_netns

REPO = Path(__file__).resolve().parents[2]
STORM_CYCLES = 500  # a veth pair added and deleted: 20 uevents (2 netdevs, 4 queues each way)
FLAPS = 1000
CLIENTS = 100
# RSS growth bounds, well above what was measured and well below the process (~52 MiB).
STORM_RSS_GROWTH_KIB = 8 * 1024
FLAPS_RSS_GROWTH_KIB = 4 * 1024
pytestmark = [root_only, pytest.mark.netns]

COUNTER = """
import signal, socket, sys
s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)  # NETLINK_KOBJECT_UEVENT
s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: count, never drop
s.bind((0, 1))
s.settimeout(0.2)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print("ready", flush=True)
n = 0
while True:
    try:
        s.recv(65536)
        n += 1
    except TimeoutError:
        if stop:
            break
print(n, flush=True)
"""


@dataclass
class Daemon:
    netns: str
    proc: subprocess.Popen[bytes]
    socket: Path

    def proc_status(self) -> dict[str, int]:
        """RSS (KiB), threads and open fds; fds as the least of 20 looks 50 ms apart,
        so a client connection the server is still closing is not counted."""
        fds = []
        for _ in range(20):
            fds.append(len(os.listdir(f"/proc/{self.proc.pid}/fd")))
            time.sleep(0.05)
        fields = {"fds": min(fds)}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
        return fields

    def status(self) -> dict[str, Any]:
        code, doc = api_get(self.socket, "/v1/status")
        assert code == 200, doc
        return doc

    def passes(self) -> int:
        return int(self.status()["daemon"]["passes"])

    def settled(self) -> dict[str, Any]:
        """Ask for a pass after everything so far and wait for it (the daemon's answer)."""
        code, doc = api_post(self.socket, "/v1/reconcile?wait=60")
        assert code == 200 and doc["answered"] is True, doc
        return self.status()


def api_post(sock_path: Path, url: str) -> tuple[int, dict[str, Any]]:
    import http.client
    import socket as socketlib

    conn = http.client.HTTPConnection("rdmad", timeout=90)
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    sock.settimeout(90)
    sock.connect(str(sock_path))
    conn.sock = sock
    try:
        conn.request("POST", url)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ip_batch(netns: str, lines: list[str]) -> None:
    subprocess.run(
        ["ip", "-n", netns, "-batch", "-"],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        capture_output=True,
        timeout=600,
    )


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with owned_netns() as netns:
        yield from _daemon_in(netns, tmp_path)


def _daemon_in(netns: str, tmp_path: Path) -> Iterator[Daemon]:
    """`rdmad run` inside ``netns`` (a veth pair there), stopped after the test."""
    short = Path(tempfile.mkdtemp(prefix="rdmad-l-", dir="/tmp"))
    proc = None
    try:
        ip_batch(netns, ["link add fl0 type veth peer name fl1", "link set fl0 up"])
        cfg = tmp_path / "etc"
        cfg.mkdir()
        (cfg / "rdmad.toml").write_text(
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
            f'[api]\nsocket = "{short / "rdmad.sock"}"\n'
            # SR-IOV objects on netdevs the storm and the flaps touch (veths have no
            # VFs: they wait). No rxe: its modprobe.d guard hook would be written on
            # this host (the daemon has no other root than /).
            '[[sriov]]\npf = { name = "fl0" }\nnumvfs = 0\ndriver_guard = false\n'
            '[[sriov]]\npf = { name = "s1" }\nnumvfs = 0\ndriver_guard = false\n'
        )
        sd = Systemd(tmp_path / "notify.sock")
        env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), PYTHONPATH=str(REPO))
        log = (tmp_path / "daemon.log").open("w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "rdmad.cli", "run",
             "--config", str(cfg), "--log-format", "json", "--log-level", "warning"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        sd.expect("READY=1", timeout=60)
        yield Daemon(netns, proc, short / "rdmad.sock")
        assert proc.poll() is None, "the daemon died"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        sd.sock.close()
        log.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(short, ignore_errors=True)


def counting_uevents(netns: str) -> subprocess.Popen[str]:
    counter = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", COUNTER],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert counter.stdout is not None and counter.stdout.readline().strip() == "ready"
    return counter


def objects(status: dict[str, Any]) -> dict[str, str]:
    return {o["obj"]: o["state"] for o in status["objects"]}


def triggers(sock_path: Path) -> dict[str, float]:
    """rdmad_events_total by source, from the daemon's /metrics."""
    import http.client
    import socket as socketlib

    conn = http.client.HTTPConnection("rdmad", timeout=30)
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(sock_path))
    conn.sock = sock
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("rdmad_events_total{"):
            labels, _, value = line.rpartition(" ")
            out[labels.split('source="')[1].split('"')[0]] = float(value)
    return out


def test_uevent_storm_with_100_api_clients(daemon: Daemon) -> None:
    before = daemon.settled()
    base = daemon.proc_status()
    passes0 = int(before["daemon"]["passes"])
    seen0 = triggers(daemon.socket)
    counter = counting_uevents(daemon.netns)
    answers: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS + 1)

    def client(i: int) -> None:
        start.wait(60)
        path = ("/v1/status", "/v1/plan", "/v1/history", "/v1/config")[i % 4]
        try:
            code, doc = api_get(daemon.socket, path)
            ok = code if "api" in doc or "error" in doc else -1
        except Exception:  # an unanswered client is a failure, counted as 0
            ok = 0
        with lock:
            answers.append(ok)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    storm = []
    for i in range(STORM_CYCLES):
        storm += [f"link add s{i % 50} type veth peer name t{i % 50}"]
        if i % 50 == 49:
            storm += [f"link del s{j}" for j in range(50)]
    half = len(storm) // 2
    ip_batch(daemon.netns, storm[:half])
    start.wait(60)  # the clients go in the middle of the storm
    ip_batch(daemon.netns, storm[half:])
    for t in threads:
        t.join(120)
    after = daemon.settled()
    counter.send_signal(signal.SIGTERM)
    out, _ = counter.communicate(timeout=30)
    uevents = int(out.strip().splitlines()[-1])
    passes = int(after["daemon"]["passes"]) - passes0
    seen = triggers(daemon.socket)
    udev = seen.get("udev", 0) - seen0.get("udev", 0)
    end = daemon.proc_status()
    figures = {
        "uevents": uevents,
        "udev_triggers": udev,
        "passes": passes,
        "rss_kib_before": base["VmRSS"],
        "rss_kib_after": end["VmRSS"],
        "fds": [base["fds"], end["fds"]],
        "threads": [base["Threads"], end["Threads"]],
        "api_answers": {str(c): answers.count(c) for c in sorted(set(answers))},
    }
    print("uevent-storm", json.dumps(figures))
    assert uevents >= 10_000
    assert passes <= uevents // 20  # at least 20 events per pass, coalesced
    assert answers.count(200) == CLIENTS, figures
    # Measured +1.2-1.3 MiB (about 52 -> 53 MiB here): the bound is a fraction of the
    # process, so 4 KiB kept per net event that reached the agent (2,000) fails it.
    assert end["VmRSS"] - base["VmRSS"] < STORM_RSS_GROWTH_KIB, figures
    # Every net add/remove of both ends of each pair reaches the agent, once (queue
    # uevents are filtered out by subsystem), and none is lost: as root the monitor's
    # 128 MiB receive buffer (rdmad/kernel/events/udev.py) holds the whole storm, so a resync
    # (the kernel dropped some: ENOBUFS) is a failure here, not a stand-in for them.
    assert udev == 4 * STORM_CYCLES, figures
    assert seen.get("resync", 0) == seen0.get("resync", 0), figures
    # Nothing left behind: no socket or stream more than before; worker threads only.
    assert end["fds"] <= base["fds"] and end["Threads"] <= base["Threads"] + 8, figures
    assert objects(after) == objects(before)
    assert not after["daemon"]["config_errors"]


def test_1000_link_flaps(daemon: Daemon) -> None:
    before = daemon.settled()
    base = daemon.proc_status()
    passes0 = int(before["daemon"]["passes"])
    seen0 = triggers(daemon.socket)
    flaps = []
    for _ in range(FLAPS):
        flaps += ["link set fl0 down", "link set fl0 up"]
    ip_batch(daemon.netns, flaps)
    after = daemon.settled()
    end = daemon.proc_status()
    passes = int(after["daemon"]["passes"]) - passes0
    netlink = triggers(daemon.socket).get("netlink", 0) - seen0.get("netlink", 0)
    figures = {
        "flaps": FLAPS,
        "netlink_triggers": netlink,
        "passes": passes,
        "rss_kib_before": base["VmRSS"],
        "rss_kib_after": end["VmRSS"],
        "fds": [base["fds"], end["fds"]],
    }
    print("link-flaps", json.dumps(figures))
    assert netlink >= FLAPS, figures  # the flaps reached the agent (down and up)
    assert passes <= FLAPS // 10, figures
    # Measured +12-20 KiB: 2 KiB kept per netlink event (2,000) fails it.
    assert end["VmRSS"] - base["VmRSS"] < FLAPS_RSS_GROWTH_KIB, figures
    assert end["fds"] <= base["fds"], figures
    assert objects(after) == objects(before)
    up = json.loads(
        subprocess.run(
            ["ip", "-n", daemon.netns, "-j", "link", "show", "fl0"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert "UP" in up[0]["flags"]
