"""The API socket: final owner and mode from the start, stale files, live listeners."""

from __future__ import annotations

import grp
import os
import socket
import stat
from pathlib import Path

import pytest
import structlog

from rdmad import config, services
from rdmad.api import unixsock
from rdmad.api.unixsock import SocketError
from rdmad.status import StatusStore
from rdmad.triggers import TriggerQueue
from tests.support.fakeclock import FakeClock

from .conftest import NO_SUCH_GROUP, ApiFactory


async def test_socket_is_0660_root_group_right_after_start(
    make_api: ApiFactory, temp_group: str
) -> None:
    api = await make_api(read_group=temp_group)
    st = os.lstat(api.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_uid == 0 and st.st_gid == grp.getgrnam(temp_group).gr_gid
    assert sorted(p.name for p in api.socket.parent.iterdir()) == ["rdmad.sock"]  # no leftovers


async def test_socket_is_root_only_when_the_group_is_missing(make_api: ApiFactory) -> None:
    api = await make_api(read_group=NO_SUCH_GROUP)
    st = os.lstat(api.socket)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_parent_directory_is_made_0755(short_dir: Path) -> None:
    path = short_dir / "run" / "rdmad" / "rdmad.sock"
    old = os.umask(0o077)  # a strict umask must not leave the directory unreachable
    try:
        listening = unixsock.listen(path, NO_SUCH_GROUP)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        unixsock.remove(listening)
    assert not path.exists()


def test_stale_socket_is_replaced(short_dir: Path) -> None:
    path = short_dir / "rdmad.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # a socket file nothing listens on (a crashed daemon's)
    dead.close()
    old_inode = os.lstat(path).st_ino
    listening = unixsock.listen(path, NO_SUCH_GROUP)
    try:
        assert os.lstat(path).st_ino == listening.inode != old_inode
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # ours now, and listening
        probe.close()
    finally:
        unixsock.remove(listening)


def test_live_listener_is_refused_and_left_alone(short_dir: Path) -> None:
    path = short_dir / "rdmad.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen(1)
    inode = os.lstat(path).st_ino
    try:
        with pytest.raises(SocketError, match="another process"):
            unixsock.listen(path, NO_SUCH_GROUP)
        assert os.lstat(path).st_ino == inode
    finally:
        other.close()


def test_a_file_that_is_not_a_socket_is_refused(short_dir: Path) -> None:
    path = short_dir / "rdmad.sock"
    path.write_text("keep me")
    with pytest.raises(SocketError, match="not a socket"):
        unixsock.listen(path, NO_SUCH_GROUP)
    assert path.read_text() == "keep me"
    assert sorted(p.name for p in short_dir.iterdir()) == ["rdmad.sock"]


def test_close_leaves_a_socket_that_is_no_longer_ours(short_dir: Path) -> None:
    path = short_dir / "rdmad.sock"
    listening = unixsock.listen(path, NO_SUCH_GROUP)
    path.unlink()
    path.write_text("someone else's")  # e.g. a second daemon took the path over
    unixsock.remove(listening)
    assert path.read_text() == "someone else's"


async def _start(location: Path) -> services.Services:
    """The daemon's services (rdmad.services.start_services) as the daemon starts them;
    READY=1 goes out whatever could not start."""
    store = StatusStore()
    systemd = _Sent()
    gate = services.ReadyGate(systemd)
    gate.notify("READY=1")
    started = await services.start_services(
        location,
        config.start_settings(location),
        store,
        TriggerQueue(FakeClock()),
        services.EarlyChanges(store),
        gate,
    )
    assert systemd.sent == ["READY=1"]
    return started


class _Sent:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def notify(self, state: str) -> None:
        self.sent.append(state)


async def test_daemon_runs_on_when_the_api_cannot_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "rdmad.toml").write_text(f'[api]\nsocket = "{blocker}/rdmad.sock"\n')
    with structlog.testing.capture_logs() as logs:
        started = await _start(tmp_path / "etc")
    try:
        assert started.api is None and started.metrics is not None  # READY=1 all the same
    finally:
        await started.close()
    [failed] = [e for e in logs if e["event"] == "api.failed"]
    assert failed["log_level"] == "error" and str(blocker) in failed["error"]


async def test_disabled_api_makes_no_socket(tmp_path: Path, short_dir: Path) -> None:
    (tmp_path / "rdmad.toml").write_text(
        f'[api]\nenabled = false\nsocket = "{short_dir}/rdmad.sock"\n'
    )
    started = await _start(tmp_path)
    try:
        assert started.api is None and not (short_dir / "rdmad.sock").exists()
    finally:
        await started.close()
