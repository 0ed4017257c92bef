"""The real daemon process: sd_notify READY/STATUS/WATCHDOG, SIGHUP reload, SIGTERM exit 0.

Runs `rdmad run` with an empty config on this host (it only reads the kernel)
and plays systemd's side of NOTIFY_SOCKET. Waits are on datagrams with deadlines.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import reap

REPO = Path(__file__).resolve().parents[2]


class Systemd:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.got: list[str] = []

    def expect(self, pred: str, timeout: float = 30.0) -> str:
        """Wait for a message containing ``pred``; return it."""
        for msg in self.got:
            if pred in msg:
                self.got.remove(msg)
                return msg
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pred!r} from the daemon in {timeout} s: {self.got}")
            self.sock.settimeout(left)
            msg = self.sock.recv(65536).decode()
            if pred in msg:
                return msg
            self.got.append(msg)


@pytest.fixture
def api_socket() -> Iterator[Path]:
    """The daemon's API socket, in a short private directory (never /run/rdmad)."""
    d = Path(tempfile.mkdtemp(prefix="rdmad-d-", dir="/tmp"))
    yield d / "rdmad.sock"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon_env(tmp_path: Path, api_socket: Path) -> Iterator[tuple[Path, Systemd, dict[str, str]]]:
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "rdmad.toml").write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[api]\nsocket = "{api_socket}"\n'
    )
    sd = Systemd(tmp_path / "notify.sock")
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), WATCHDOG_USEC="400000")
    env.pop("WATCHDOG_PID", None)
    # A declared rxe link makes the daemon guard rdma_rxe with a hook in this host's
    # /etc/modprobe.d: put back what was there before.
    hook = Path("/etc/modprobe.d/rdmad-guard.conf")
    before = hook.read_bytes() if hook.exists() else None
    try:
        yield cfg, sd, env
    finally:
        sd.sock.close()
        if before is None:
            hook.unlink(missing_ok=True)
        elif not hook.exists() or hook.read_bytes() != before:
            hook.write_bytes(before)


def api_get(sock_path: Path, url: str) -> tuple[int, dict[str, object]]:
    """One request over the daemon's API socket, with the standard library. Right after
    READY=1 the answer may wait for the web library's import (the socket listens before
    it, rdmad.services): on a loaded CI host that is seconds, hence the bound."""
    conn = http.client.HTTPConnection("rdmad", timeout=30)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(sock_path))
    conn.sock = sock
    try:
        conn.request("GET", url)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def launch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """`rdmad run ARGS` from this tree, its output in tmp_path/daemon.log."""
    with (tmp_path / "daemon.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "rdmad.cli", "run", *args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_ready_status_watchdog_reload_and_term(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path, api_socket: Path
) -> None:
    cfg, sd, env = daemon_env
    proc = launch(tmp_path, env, "--foreground", "--config", str(cfg), "--log-format", "json")
    try:
        ready = sd.expect("READY=1")
        assert "STATUS=nothing declared" in ready
        # The API socket was there by READY=1, and it is this daemon answering.
        code, status = api_get(api_socket, "/v1/status")
        assert code == 200 and status["summary"] == "nothing declared"
        assert status["daemon"]["pid"] == proc.pid  # type: ignore[index]
        sd.expect("WATCHDOG=1", timeout=5)

        (cfg / "rdmad.toml").write_text("[daemon]\nsettle = 'soon'\n")
        proc.send_signal(signal.SIGHUP)
        sd.expect("RELOADING=1")
        assert "config invalid (1 error(s)), last good kept" in sd.expect("READY=1")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        sd.expect("STOPPING=1", timeout=5)
        assert not api_socket.exists()  # removed on the way out
    finally:
        reap(proc)
    text = (tmp_path / "daemon.log").read_text()
    assert "config.invalid" in text and "settle" in text
    assert (tmp_path / "state" / "state.json").is_file()


def test_unreadable_dropin_at_start_keeps_running_and_reports_it(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path, api_socket: Path
) -> None:
    """A non-UTF-8 drop-in used to end `run()` (and Restart=on-failure looped on it)."""
    cfg, sd, env = daemon_env
    api = (cfg / "rdmad.toml").read_text().split("[api]")[1]
    (cfg / "rdmad.toml").write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_level = "debug"\n[api]{api}'
    )
    dropin = cfg / "rdmad.d" / "50-latin1.toml"
    dropin.parent.mkdir()
    dropin.write_bytes(b'[[rxe]]\nname = "r\xe9seau"\nnetdev = { name = "eth0" }\n')
    proc = launch(tmp_path, env, "--config", str(cfg), "--log-format", "json")
    try:
        ready = sd.expect("READY=1")
        assert "config invalid (1 error(s))" in ready
        # The invalid config did not take the API away: it is how one sees why.
        code, status = api_get(api_socket, "/v1/status")
        assert code == 200 and "not UTF-8" in str(status["daemon"]["config_errors"])  # type: ignore[index]
        sd.expect("WATCHDOG=1", timeout=5)  # the loop runs on
        assert proc.poll() is None

        dropin.write_text('[[rxe]]\nname = "reseau"\nnetdev = { name = "rdmad-nonesuch0" }\n')
        proc.send_signal(signal.SIGHUP)
        sd.expect("RELOADING=1")
        ready = sd.expect("READY=1")
        assert "config invalid" not in ready and "rxe reseau" in ready

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    events = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    invalid = [e for e in events if e.get("event") == "config.invalid"]
    assert [e["error"] for e in invalid] == [
        f"{dropin}: not UTF-8 text: byte 0xe9 at line 2, column 10; TOML files must be UTF-8"
    ]
    # The readable part of the config chose the state dir and the log level.
    assert any(e.get("level") == "debug" for e in events)
    assert (tmp_path / "state" / "state.json").is_file()


def test_dry_run_against_a_made_up_node_plans_it_and_changes_nothing(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path, api_socket: Path
) -> None:
    """`rdmad run --dry-run --root TREE`: the daemon's passes over a node that is not this
    host (the fake mlx5 + igb node of the demo); what it would do is its plan, and the
    tree is left as it was."""
    from tests.support.fakesysfs import mlx5_node

    cfg, sd, env = daemon_env
    root = tmp_path / "node"
    mlx5_node(root)
    numvfs = root / "sys/bus/pci/devices/0000:5e:00.0/sriov_numvfs"
    before = numvfs.read_text()
    (cfg / "rdmad.d").mkdir()
    (cfg / "rdmad.d" / "50-demo.toml").write_text(
        (REPO / "tests/fixtures/demo-node.toml").read_text()
    )
    args = ["--config", str(cfg), "--root", str(root)]
    refused = subprocess.run(
        [sys.executable, "-m", "rdmad.cli", "run", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "add --dry-run" in refused.stderr
    proc = launch(tmp_path, env, *args, "--dry-run", "--log-format", "json")
    try:
        sd.expect("READY=1")
        code, plan = api_get(api_socket, "/v1/plan")
        assert code == 200
        kinds = {a["kind"] for a in plan["actions"]}  # type: ignore[union-attr, index]
        assert "set-numvfs" in kinds, plan
        code, status = api_get(api_socket, "/v1/status")
        pfs = {o["obj"] for o in status["objects"]}  # type: ignore[union-attr, index]
        assert "sriov pci=0000:3b:00.0" in pfs, pfs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    assert numvfs.read_text() == before


def test_guard_kit_is_installed_before_the_first_pass_and_the_hook_goes_at_stop(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path
) -> None:
    """`rdmad run --guard-kit DIR` (rdmad in a container): the guard's copy for a host
    without the package is in DIR by READY=1, and on the way out rdmad removes the hook
    file. (Which modules the hook lines guard needs loadable modules, which this
    machine has not: tests/lab/test_guard_container_lab.py shows the hook at work.)"""
    cfg, sd, env = daemon_env
    kit = tmp_path / "guard"
    proc = launch(
        tmp_path, env, "--config", str(cfg), "--guard-kit", str(kit), "--log-format", "json"
    )
    try:
        sd.expect("READY=1")
        copies = list(kit.glob("rdmad-*"))
        assert len(copies) == 1 and (copies[0] / "rdmad/guard/cli.py").is_file()
        assert f"kit={copies[0]}" in (kit / "hook").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    assert not Path("/etc/modprobe.d/rdmad-guard.conf").exists()
    assert (kit / "hook").is_file()  # the copy stays: a hook left by a crash still runs
    events = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    names = [e.get("event") for e in events]
    assert "guard_kit.installed" in names and "guard_hook.removed" in names


def test_guard_kit_that_cannot_be_written_stops_rdmad_before_any_hook(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path
) -> None:
    cfg, _, env = daemon_env
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    argv = [sys.executable, "-m", "rdmad.cli", "run", "--config", str(cfg)]
    argv += ["--guard-kit", str(blocker / "guard"), "--log-format", "json"]
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert "guard_kit.failed" in proc.stdout + proc.stderr


def test_a_dry_run_writes_no_guard_kit(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path
) -> None:
    """`rdmad run --dry-run --guard-kit DIR` changes nothing: no copy, no hook script, no
    older copy removed (it may be the running image's), and at its stop the node's hook
    file (another rdmad's) stays."""
    from tests.support.fakesysfs import mlx5_node

    cfg, sd, env = daemon_env
    root = tmp_path / "node"
    mlx5_node(root)
    hook_file = root / "etc/modprobe.d/rdmad-guard.conf"
    hook_file.parent.mkdir(parents=True)
    hook_file.write_text("remove igb exec /bin/sh /var/lib/rdmad/guard/hook remove igb\n")
    kit = tmp_path / "guard"
    older = kit / "rdmad-0.0.1-000000000000"
    older.mkdir(parents=True)
    proc = launch(
        tmp_path, env, "--config", str(cfg), "--root", str(root), "--guard-kit", str(kit),
        "--dry-run", "--log-format", "json",
    )  # fmt: skip
    try:
        sd.expect("READY=1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    assert [p.name for p in kit.iterdir()] == [older.name]
    assert hook_file.is_file()  # a dry run removes nothing either
    events = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    [said] = [e for e in events if e.get("event") == "guard_kit.not_written"]
    assert said["hook"] == str(kit / "hook")
    assert said["command"] == f"/bin/sh {kit / 'hook'}"  # never exec'd: noexec mounts


# `rdmad run`, counting the opens of the config's main file (the "open" audit event of
# os.open and open()), the count printed at exit.
COUNTING_CONFIG_OPENS = """
import atexit, runpy, sys
opens = []
def hook(event, args):
    if event == "open" and str(args[0]).endswith("rdmad.toml"):
        opens.append(args[0])
sys.addaudithook(hook)
atexit.register(lambda: print(f"CONFIG_OPENS {len(opens)}", flush=True))
sys.argv[0] = "rdmad"
runpy.run_module("rdmad.cli", run_name="__main__")
"""


def test_the_config_is_read_once_for_the_start_settings_and_once_by_the_agent(
    daemon_env: tuple[Path, Systemd, dict[str, str]], tmp_path: Path, api_socket: Path
) -> None:
    """[daemon], [api] and [metrics] are one reading at start (what the daemon set itself
    up with and what a reload compares with), the agent's load the other: twice in all,
    with the API and metrics started (it was six times: each section read on its own,
    [api] and [metrics] twice)."""
    cfg, sd, env = daemon_env
    with (tmp_path / "daemon.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", COUNTING_CONFIG_OPENS, "run", "--config", str(cfg)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        sd.expect("READY=1")
        code, _ = api_get(api_socket, "/v1/status")  # the services have started
        assert code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    text = (tmp_path / "daemon.log").read_text()
    assert "CONFIG_OPENS 2" in text.splitlines(), text
