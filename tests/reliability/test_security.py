"""Security: other users cannot change anything, files that others could write are
refused, names are never shell text, and paths stay under the sysfs root.

The clients "as another user" are real processes under uid nobody (setpriv, or a
forked child that dropped its uid); the netdevs with hostile names are real links in
a network namespace this test creates.
"""

from __future__ import annotations

import ast
import contextlib
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad import config
from rdmad.api.unixsock import listen, remove
from rdmad.fileio import write_atomic
from rdmad.kernel.guardhook import write_hook
from rdmad.kernel.pause import PAUSE_FILE, write_pause
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import MetricsSpec
from rdmad.tomlcompat import tomllib
from tests.api.conftest import ApiFactory, as_nobody
from tests.reliability.conftest import NOBODY, as_uid, root_only
from tests.support.fakesysfs import DEV, FakeSysfs, mlx5_node
from tests.support.netns import owned_netns

REPO = Path(__file__).resolve().parents[2]
MUTATIONS = (
    ("POST", "/v1/reload"),
    ("POST", "/v1/reconcile"),
    ("POST", "/v1/pause"),
    ("DELETE", "/v1/pause"),
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="rdmad-rel-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- the API as another uid --------------------------------------------------------------


@root_only
@pytest.mark.parametrize("in_read_group", [False, True], ids=["stranger", "read-group"])
async def test_every_mutating_endpoint_is_refused_for_another_uid(
    make_api: ApiFactory, temp_group: str, tmp_path: Path, in_read_group: bool
) -> None:
    pause_root = tmp_path / "pause-root"
    api = await make_api(read_group=temp_group, pause_root=str(pause_root))
    os.chmod(api.socket, 0o666)  # let nobody reach the socket: the API itself must refuse
    before = (api.queue.total, api.agent.memory.desired, api.passes)
    for method, path in MUTATIONS:
        code, body = await as_nobody(
            api.socket, method, path, groups=temp_group if in_read_group else None
        )
        assert code == 403, (method, path, body)
        assert json.loads(body)["error"]["code"] == "forbidden"
    assert (api.queue.total, api.agent.memory.desired, api.passes) == before
    assert not (pause_root / PAUSE_FILE).exists()


def test_the_socket_never_exists_with_a_looser_mode(tmp_path: Path) -> None:
    """Watch the path while the socket is created and removed 50 times: every mode
    ever seen there is the final one (it is bound and chmod'ed elsewhere, then renamed).

    Each socket is removed only once the watcher has seen one at the path, so the
    watcher looked at every round (a watcher that never saw a socket proved nothing)."""
    path = tmp_path / "rdmad.sock"
    seen: set[int] = set()
    sighted = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.add(stat.S_IMODE(os.lstat(path).st_mode))
                sighted.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    rounds = 0
    try:
        for _ in range(50):
            sighted.clear()
            listening = listen(path, "rdmad-nonesuch")  # no such group: root-only, 0600
            try:
                assert sighted.wait(10), f"the watcher never saw a socket at {path}"
            finally:
                remove(listening)
            rounds += 1
    finally:
        done.set()
        watcher.join(10)
    assert rounds == 50
    assert seen == {0o600}, {oct(m) for m in seen}
    assert sorted(os.listdir(tmp_path)) == []  # no staging directory left behind


# --- config files that others could change -------------------------------------------------


def _config(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    (d / "rdmad.d").mkdir(parents=True)
    (d / "rdmad.toml").write_text('[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n')
    (d / "rdmad.d" / "10-b.toml").write_text('[[rxe]]\nname = "rxe1"\nnetdev = { name = "eth1" }\n')
    return d


@pytest.mark.parametrize(
    ("rel", "mode", "why"),
    [
        ("rdmad.toml", 0o664, "group-writable (mode 0664)"),
        ("rdmad.d/10-b.toml", 0o646, "world-writable (mode 0646)"),
        ("rdmad.d/10-b.toml", 0o666, "group- and world-writable (mode 0666)"),
    ],
)
def test_a_config_file_others_can_write_is_refused_naming_file_and_why(
    tmp_path: Path, rel: str, mode: int, why: str
) -> None:
    d = _config(tmp_path)
    os.chmod(d / rel, mode)
    with pytest.raises(config.ConfigInvalid) as caught:
        config.load(d)
    (err,) = caught.value.errors
    assert err.file == str(d / rel)
    assert err.message.startswith(f"refused: the file is {why}") and "chmod go-w" in str(err)


@root_only
def test_a_config_file_not_owned_by_root_is_refused_when_rdmad_runs_as_root(
    tmp_path: Path,
) -> None:
    d = _config(tmp_path)
    os.chown(d / "rdmad.d/10-b.toml", NOBODY, -1)
    with pytest.raises(config.ConfigInvalid) as caught:
        config.load(d)
    assert [str(e) for e in caught.value.errors] == [
        f"{d}/rdmad.d/10-b.toml: refused: the file is owned by uid {NOBODY}, not root; "
        "a config that rdmad runs as root must belong to root (chown root)"
    ]
    # The same file through a symlink is the same refusal (the check is on what opens).
    os.symlink(d / "rdmad.d/10-b.toml", d / "rdmad.d/20-link.toml")
    with pytest.raises(config.ConfigInvalid) as caught:
        config.load(d)
    assert len(caught.value.errors) == 2 and "owned by uid" in str(caught.value.errors[1])


@root_only
def test_a_user_other_than_root_loads_its_own_and_roots_config(open_dir: Path) -> None:
    """Ownership is enforced only for root; `rdmad check-config` as a user still works."""
    d = _config(open_dir)
    os.chown(d / "rdmad.d/10-b.toml", NOBODY, -1)  # a user's own drop-in, 0644

    def load_as_nobody() -> None:
        loaded = config.load(d)
        assert [r.name for r in loaded.desired.rxe] == ["rxe0", "rxe1"]

    assert as_uid(load_as_nobody) == 0


@root_only
async def test_reload_with_a_world_writable_dropin_keeps_the_last_good_config(
    make_api: ApiFactory,
) -> None:
    api = await make_api()
    good = api.agent.memory.desired
    assert [r.name for r in good.rxe] == ["rxe0", "rxe1"]
    dropin = api.config_dir / "rdmad.d" / "10-more.toml"
    dropin.write_text('[[rxe]]\nname = "rxe9"\nnetdev = { name = "eth2" }\n')
    os.chmod(dropin, 0o666)
    code, doc = await api.post("/v1/reload?wait=10")
    assert code in (200, 409, 422), doc
    code, status = await api.get("/v1/status")
    errors = status["daemon"]["config_errors"]
    assert errors == [f"{dropin}: refused: " + errors[0].split(": refused: ", 1)[1]]
    assert "world-writable" in errors[0]
    assert api.agent.memory.desired == good  # rxe9 was never declared
    assert "rxe9" not in json.dumps(status)


# --- the guard and the pause cannot be changed by another user -----------------------------


@root_only
def test_guard_hook_and_pause_file_are_not_writable_by_others(open_dir: Path) -> None:
    root = open_dir / "root"
    (root / "etc/modprobe.d").mkdir(parents=True)
    os.chmod(root, 0o755)
    sysfs = Sysfs(root)
    write_hook(sysfs, ["igb"], "/usr/sbin/rdmad-guard hook")
    write_pause(sysfs, by="root", reason="test", seconds=90, modules=["ib_core"], now=1000.0)
    hook = root / "etc/modprobe.d/rdmad-guard.conf"
    pause = root / PAUSE_FILE
    for path in (hook, pause):
        st = os.stat(path)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o022 == 0, (path, oct(st.st_mode))
        parent = os.stat(path.parent)
        assert stat.S_IMODE(parent.st_mode) & 0o022 == 0, path.parent

        def append(p: Path = path) -> None:
            with open(p, "a") as fh:
                fh.write("install igb /bin/true\n")

        def replace(p: Path = path) -> None:
            write_atomic(p, b"{}")

        assert as_uid(append) == 1 and as_uid(replace) == 1  # PermissionError both ways


# --- metrics listener ----------------------------------------------------------------------


def test_the_metrics_tcp_listener_is_off_by_default_and_documented_on_loopback() -> None:
    from rdmad.api.metrics_http import DEFAULT_LISTEN, parse_listen

    assert MetricsSpec().listen is None  # no TCP socket unless configured
    assert ipaddress.ip_address(parse_listen(DEFAULT_LISTEN)[0]).is_loopback
    example = tomllib.loads((REPO / "etc/rdmad/rdmad.toml").read_text())
    assert example.get("metrics", {}).get("listen") in (None, DEFAULT_LISTEN)


@pytest.mark.parametrize("listen", ["127.0.0.1:9478", "127.0.0.53:1", "[::1]:9478", "localhost:9"])
def test_a_loopback_metrics_listener_is_accepted(tmp_path: Path, listen: str) -> None:
    (tmp_path / "rdmad.toml").write_text(f'[metrics]\nlisten = "{listen}"\n')
    assert config.load(tmp_path).desired.metrics.listen == listen


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:9478", "[::]:9478", "10.1.2.3:9478", "node1.example:9478", "[fe80::1]:1"]
)
def test_a_metrics_listener_beyond_loopback_is_a_config_error(tmp_path: Path, listen: str) -> None:
    (tmp_path / "rdmad.toml").write_text(f'[metrics]\nlisten = "{listen}"\n')
    with pytest.raises(config.ConfigInvalid) as caught:
        config.load(tmp_path)
    (err,) = caught.value.errors
    assert (err.file, err.path) == (str(tmp_path / "rdmad.toml"), "metrics.listen")
    assert "loopback address only" in err.message
    # At start the daemon takes [metrics] key by key: this one is dropped, so no listener.
    assert config.start_settings(tmp_path).metrics.listen is None


# --- no shell, hostile netdev names ----------------------------------------------------------


def test_no_shell_anywhere_in_rdmad() -> None:
    """No code path can hand a name to a shell: no shell=True, os.system, os.popen,
    create_subprocess_shell, and every subprocess gets an argument list."""
    found = []
    for path in sorted((REPO / "rdmad").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = ast.unparse(node.func)
            if fn in ("os.system", "os.popen", "asyncio.create_subprocess_shell"):
                found.append(f"{path}:{node.lineno} {fn}")
            for kw in node.keywords:
                if kw.arg == "shell" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{path}:{node.lineno} shell=")
            is_spawn = fn.startswith("subprocess.") or fn.endswith("create_subprocess_exec")
            if is_spawn and node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr):
                found.append(f"{path}:{node.lineno} {fn} with a string command")
    assert found == []


# Valid Linux names (1-15 bytes, no '/', ':' or whitespace) that are shell code, as
# veth pairs (this host has no dummy driver).
PAIRS = (("a;touch${IFS}x", "b`touch`y"), ("c|d&e>f", "$(reboot)"), ("ünï-çødé", "g'h\"i"))
HOSTILE = tuple(name for pair in PAIRS for name in pair)


@pytest.fixture
def hostile_netns() -> Iterator[str]:
    with owned_netns() as name:
        for a, b in PAIRS:
            subprocess.run(
                ["ip", "-n", name, "link", "add", a, "type", "veth", "peer", "name", b],
                check=True,
                capture_output=True,
            )
            for dev in (a, b):
                subprocess.run(
                    ["ip", "-n", name, "link", "set", dev, "up"], check=True, capture_output=True
                )
        yield name


OBSERVE_NAMES = """
import json
from pathlib import Path
from rdmad.kernel.apply.oneshot import observe_host
print(json.dumps([n.name for n in observe_host(Path("/")).netdevs]))
"""


@root_only
@pytest.mark.netns
def test_netdevs_named_like_shell_injection_are_only_names(
    hostile_netns: str, tmp_path: Path
) -> None:
    """snapshot, check-config and plan in a namespace whose links are named like shell
    code: each name comes back verbatim, and nothing was run (no file appeared)."""
    work = tmp_path / "cwd"
    work.mkdir()
    cfg = tmp_path / "rdmad.toml"
    rxe = "".join(
        f'[[rxe]]\nname = "rxe{i}"\nnetdev = {{ name = {json.dumps(dev)} }}\n'
        for i, dev in enumerate(HOSTILE)
    )
    cfg.write_text(rxe)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", hostile_netns, sys.executable, *args],
            check=False,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    seen = run("-c", OBSERVE_NAMES)
    assert seen.returncode == 0, seen.stderr
    assert sorted(json.loads(seen.stdout)) == sorted(("lo", *HOSTILE))
    snap = run("-m", "rdmad.cli", "snapshot", "--json")
    assert snap.returncode == 0, snap.stderr
    check = run("-m", "rdmad.cli", "check-config", "--config", str(cfg))
    assert check.returncode == 0, check.stdout + check.stderr
    state = str(tmp_path / "s.json")
    plan = run("-m", "rdmad.cli", "plan", "--local", "--config", str(cfg), "--state", state)
    assert plan.returncode in (0, 1), plan.stderr  # 1: rxe blocked (no rdma_rxe here)
    assert "Traceback" not in plan.stderr
    assert sorted(os.listdir(work)) == []  # no `touch` ran anywhere


# --- paths stay under the sysfs root ----------------------------------------------------------


@pytest.mark.parametrize(
    "rel",
    [
        "..",
        "../outside",
        "sys/../../outside",
        "sys/class/net/../../../../outside",
        "/../outside",
        "sys/bus/pci/devices/../../../../../outside/x",
    ],
)
def test_sysfs_paths_never_lead_above_the_root(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "root"
    FakeSysfs(root)
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "x").write_text("secret")
    sysfs = Sysfs(root)
    assert sysfs.read(rel) is None and sysfs.read(f"{rel}/x") is None
    assert sysfs.listdir(rel) == [] and not sysfs.exists(rel)
    with pytest.raises(Exception, match="out of the sysfs root"):
        sysfs.write(f"{rel}/x", "1")
    assert (secret / "x").read_text() == "secret"


def test_absolute_names_are_under_the_root_and_kernel_symlinks_give_only_basenames(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    fs = mlx5_node(root)
    sysfs = Sysfs(root)
    assert sysfs.path("/etc/passwd") == f"{root}/etc/passwd"
    assert sysfs.read("/proc/cmdline") == "root=/dev/sda1 ro iommu=pt"
    # A driver link that points out of the tree yields a name, never a path out.
    outside = tmp_path / "evil-driver"
    outside.mkdir()
    fs.link(f"{DEV}/0000:3b:00.2/driver", str(outside))
    assert sysfs.link_name(f"{DEV}/0000:3b:00.2/driver") == "evil-driver"
    function = sysfs.pci_function("0000:3b:00.2")
    assert function is not None and function.driver == "evil-driver"
    shutil.rmtree(outside)


def test_the_one_shell_line_rdmad_writes_takes_only_module_names_and_a_quoted_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """modprobe runs a modprobe.d ``remove`` line through /bin/sh: the guard hook is the
    one place rdmad writes shell text. Module names that are not names are refused, and
    the interpreter's path is quoted whatever it contains."""
    from rdmad.kernel import guardhook

    for bad in ("igb;reboot", "igb x", "$(id)", "a`b`", "igb\nremove x"):
        with pytest.raises(ValueError, match="not a module name"):
            guardhook.render([bad], "/usr/bin/python3 -I -m rdmad.guard")
    monkeypatch.setattr(sys, "executable", "/opt/my venv;touch x/bin/python")
    command = guardhook.guard_command()
    assert command == "'/opt/my venv;touch x/bin/python' -I -m rdmad.guard"
    line = guardhook.render(["igb"], command).splitlines()[-1]
    assert line == (
        "remove igb [ -e '/opt/my venv;touch x/bin/python' ] || "
        "exec /sbin/modprobe -r --ignore-remove igb; "
        "exec '/opt/my venv;touch x/bin/python' -I -m rdmad.guard remove igb"
    )
