"""The real ApiServer on a real UNIX socket, over a real Agent driving the fake host.

The agent runs on the system clock with a 10 ms settle window, so the API's
triggers go the whole way: queue -> pass -> status/plan with ``answered``. The
socket lives in a short private directory (a UNIX socket path has 108 bytes).
Clients are aiohttp sessions on the same socket, or (for SO_PEERCRED) curl run as
another user.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rdmad import config
from rdmad.agent import Agent, AgentOptions
from rdmad.api import ApiServer
from rdmad.clock import SystemClock
from rdmad.kernel.apply.oneshot import observe_host
from rdmad.model import ApiSpec
from rdmad.state import StateStore
from rdmad.triggers import TriggerQueue
from tests.agent.conftest import FakeHost, Notes
from tests.support.fakesysfs import mlx5_node

MAIN_TOML = """\
[daemon]
settle = "10ms"

[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }
"""
DROPIN_TOML = """\
[[rxe]]
name = "rxe1"
netdev = { name = "eth1" }
"""
NO_SUCH_GROUP = "rdmad-nonesuch"


async def until(pred: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Wait for a condition with a deadline, yielding to the loop between looks."""
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.005)
    assert pred(), what


@dataclass
class Api:
    server: ApiServer
    agent: Agent
    host: FakeHost
    queue: TriggerQueue
    config_dir: Path
    socket: Path
    session: aiohttp.ClientSession

    @property
    def passes(self) -> int:
        return len(self.agent.passes)

    def url(self, path: str) -> str:
        return f"http://rdmad{path}"

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.get(self.url(path), **kw) as resp:
            return resp.status, await _body(resp)

    async def post(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.post(self.url(path), **kw) as resp:
            return resp.status, await _body(resp)


async def _body(resp: aiohttp.ClientResponse) -> Any:
    if resp.content_type == "application/json":
        return await resp.json()
    return await resp.text()


def session_for(path: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(path), limit=0, force_close=True),
        timeout=aiohttp.ClientTimeout(total=20),
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a short path (sockets), readable by other users."""
    path = Path(tempfile.mkdtemp(prefix="rdmad-api-", dir="/tmp"))
    path.chmod(0o755)  # the unprivileged clients must reach the socket inside
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    (d / "rdmad.d").mkdir(parents=True)
    (d / "rdmad.toml").write_text(MAIN_TOML)
    (d / "rdmad.d" / "10-more.toml").write_text(DROPIN_TOML)
    return d


ApiFactory = Callable[..., Awaitable[Api]]


@pytest.fixture
async def make_api(short_dir: Path, config_dir: Path, tmp_path: Path) -> AsyncIterator[ApiFactory]:
    made: list[tuple[Api, asyncio.Task[None]]] = []
    sysfs = tmp_path / "sysfs"
    mlx5_node(sysfs)

    async def make(
        read_group: str = NO_SUCH_GROUP,
        write_group: str | None = None,
        socket_name: str = "rdmad.sock",
        **server_kw: Any,
    ) -> Api:
        clock = SystemClock()
        queue = TriggerQueue(clock)
        host = FakeHost()
        agent = Agent(
            host,
            lambda: config.load(config_dir),
            clock=clock,
            queue=queue,
            notifier=Notes(),
            state_store=StateStore(tmp_path / "state"),
            boot_id="boot-1",
            options=AgentOptions(backoff_jitter=0.0, drift_jitter=0.0),
        )
        spec = ApiSpec(
            socket=str(short_dir / socket_name), read_group=read_group, write_group=write_group
        )
        server_kw.setdefault("observe", lambda: observe_host(sysfs))
        server = ApiServer(agent.status, queue, config_dir, spec, **server_kw)
        await server.start()  # before the agent runs, as the daemon does it
        task = asyncio.get_running_loop().create_task(agent.run())
        api = Api(
            server,
            agent,
            host,
            queue,
            config_dir,
            Path(spec.socket),
            session_for(Path(spec.socket)),
        )
        made.append((api, task))
        await until(lambda: agent.ready, "the agent's first pass")
        return api

    yield make
    for api, task in made:
        await api.session.close()
        await api.server.close()
        api.agent.stop()
        await asyncio.wait_for(task, 5)


@pytest.fixture
async def api(make_api: ApiFactory) -> Api:
    return await make_api()


# --- other users (SO_PEERCRED) ----------------------------------------------------------


def require_root(what: str) -> None:
    """Tests that need root (another uid, groupadd) fail under CI and skip elsewhere,
    saying so: CI runs as root, so a skip there would hide a broken check."""
    if os.geteuid() == 0:
        return
    message = f"{what} needs root (to run a client as nobody / create a group)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def temp_group() -> Iterator[str]:
    """A group that exists only for this test (groupadd, groupdel after)."""
    require_root("a temporary group")
    name = f"rdmadt{os.getpid() % 100000}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["groupdel", name], check=True, capture_output=True)


async def as_nobody(
    socket: Path, method: str, path: str, groups: str | None = None
) -> tuple[int, str]:
    """curl over the socket as uid nobody (optionally with supplementary ``groups``),
    in a thread: the server answering it runs on this test's loop. Code 0: no answer
    (curl could not connect)."""
    require_root("a client as nobody")
    curl = shutil.which("curl")
    setpriv = shutil.which("setpriv")
    assert curl and setpriv, "curl and setpriv (util-linux) are needed"
    group_args = [f"--groups={groups}"] if groups else ["--clear-groups"]
    cmd = [
        setpriv, "--reuid=nobody", "--regid=nogroup", *group_args, "--",
        curl, "-sS", "--max-time", "10", "-X", method, "--unix-socket", str(socket),
        "-w", "\n%{http_code}", f"http://rdmad{path}",
    ]  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=20)
    body, _, code = done.stdout.rpartition("\n")
    if done.returncode != 0:
        assert code in ("", "000"), done.stderr
        return 0, done.stderr
    return int(code), body
