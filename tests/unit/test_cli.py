"""The `rdmad` command line: exit codes, human output and --json, on the demo tree.

The demo node's mlx5 PF stays blocked (a VF held by QEMU would go): a plan of it exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rdmad import __version__
from rdmad.cli import main
from tests.support.fakesysfs import IGB_PF, MLX5_PF, MLX5_VFS, QEMU_PID, FakeSysfs, mlx5_node

REPO = Path(__file__).resolve().parents[2]

DEMO = (REPO / "tests/fixtures/demo-node.toml").read_text()


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    mlx5_node(root)
    cfg = tmp_path / "rdmad.toml"
    cfg.write_text(DEMO)
    return root, cfg


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rdmad.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"rdmad {__version__}"


def test_check_config_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(REPO / "etc/rdmad/rdmad.toml")]) == 0
    assert "config OK" in capsys.readouterr().out


def test_check_config_bad_exits_6_with_every_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rdmad.toml"
    bad.write_text('[daemon]\nsettle = "x"\n[[rxe]]\nname = "r"\nnetdev = {}\n')
    assert main(["check-config", "--config", str(tmp_path)]) == 6
    err = capsys.readouterr().err
    assert "2 error(s)" in err
    assert f"{bad}:2: daemon.settle: not a duration" in err  # FILE:LINE: key
    assert f"{bad}:5: rxe[0].netdev: a netdev reference needs exactly one" in err


def test_check_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rdmad.toml").write_text("[peermem]\nmode = 7\n")
    assert main(["check-config", "--json", "--config", str(tmp_path)]) == 6
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False and data["error"]["code"] == "config-invalid"
    errors = data["error"]["errors"]
    assert errors[0]["path"] == "peermem.mode" and errors[0]["line"] == 2


def test_plan_on_demo_tree(demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root, cfg = demo
    assert main(["plan", "--root", str(root), "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert f"{IGB_PF}: sriov_numvfs 0 -> 4" in out
    assert "rdma link add rxe0 type rxe netdev eth0" in out
    assert f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61" in out
    assert "0000:3b:00.5: driver unset -> vfio-pci" in out


def test_plan_json_is_what_the_text_says(
    demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, cfg = demo
    assert main(["plan", "--json", "--root", str(root), "--config", str(cfg)]) == 1
    data = json.loads(capsys.readouterr().out)
    states = {o["obj"]: o["state"] for o in data["objects"]}
    assert states == {
        f"sriov pci={MLX5_PF}": "blocked",
        "sriov name=enp94s0f0": "pending",
        "rxe rxe0": "pending",
    }
    kinds = [a["kind"] for a in data["actions"]]
    assert kinds == ["set-ib-vf", "blocked", "bind-vf", "set-numvfs", "add-rxe", "sync-guard-hook"]
    # The fake tree's PFs have no driver/module link (built in, as far as it shows): only
    # rdma_rxe gets a hook, for the declared rxe link.
    assert data["actions"][-1]["describe"] == "guard `modprobe -r` of rdma_rxe (modprobe.d hook)"


def test_plan_with_bad_config_changes_nothing(
    demo: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = demo
    bad = tmp_path / "bad.toml"
    bad.write_text("[[sriov]]\nnumvfs = -1\n")
    before = sorted(p.name for p in root.rglob("*"))
    assert main(["plan", "--root", str(root), "--config", str(bad)]) == 6
    assert "sriov[0].pf: required key is missing" in capsys.readouterr().err
    assert main(["plan", "--json", "--root", str(root), "--config", str(bad)]) == 6
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "config-invalid"
    assert "sriov[0].pf" in [e["path"] for e in error["errors"]]
    assert sorted(p.name for p in root.rglob("*")) == before


@pytest.mark.parametrize("command", [["plan"], ["snapshot"], ["run", "--dry-run"]])
def test_a_root_that_is_not_there_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Not an empty node ("0 PFs", everything to create): the path is wrong."""
    missing = tmp_path / "nonexistent"
    config = [] if command[0] == "snapshot" else ["--config", str(tmp_path)]
    assert main([*command, "--root", str(missing), *config]) == 2
    assert f"--root {missing}: not a directory" in capsys.readouterr().err
    if command[0] != "run":
        assert main([*command, "--json", "--root", str(missing)]) == 2
        error = json.loads(capsys.readouterr().out)["error"]
        assert error == {
            "code": "usage",
            "exit": 2,
            "message": f"--root {missing}: not a directory",
        }


def test_plan_on_this_host_with_nothing_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--config", str(tmp_path)]) == 0
    assert "Nothing to do" in capsys.readouterr().out


def test_snapshot_round_trip_on_demo_tree(
    demo: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = demo
    out = tmp_path / "snap" / "rdmad.toml"
    out.parent.mkdir()
    assert main(["snapshot", "--root", str(root), "-o", str(out)]) == 0
    text = out.read_text()
    assert f'pf = {{ pci = "{MLX5_PF}" }}' in text
    assert 'driver = "vfio-pci"' in text  # VF 1, bound by hand
    assert "VF settings not read" in text  # a tree has no netlink: said, not guessed
    assert capsys.readouterr().out == ""  # -o: nothing on stdout
    assert 'driver = "none"' in text  # VF 3, unbound by hand
    assert main(["plan", "--json", "--root", str(root), "--config", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    # Converged but for pinning the unbound VF with driver_override (its binding stays).
    assert [a["describe"] for a in data["actions"]] == [f"{MLX5_VFS[3]}: driver unset -> none"]


def test_snapshot_to_stdout_and_json(
    demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = demo
    assert main(["snapshot", "--root", str(root)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Written by `rdmad snapshot`") and "[[sriov]]" in text
    assert main(["snapshot", "--json", "--root", str(root)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["toml"] == text and data["settings_unknown"] == [MLX5_PF]
    # GET /v1/snapshot's document, as `rdmad-ctl snapshot --json` prints it
    assert set(data) == {"api", "toml", "config", "notes", "settings_unknown"}
    assert data["config"]["sriov"][0]["pf"] == {"pci": MLX5_PF}


def test_check_config_lists_every_unreadable_file_and_exits_6(tmp_path: Path) -> None:
    (tmp_path / "rdmad.toml").write_text("[daemon]\nsettle = 'soon'\n")
    d = tmp_path / "rdmad.d"
    d.mkdir()
    (d / "10-latin1.toml").write_bytes(b"# caf\xe9\n")
    (d / "20-dir.toml").mkdir()
    (d / "30-loop.toml").symlink_to(d / "30-loop.toml")
    out = subprocess.run(
        [sys.executable, "-m", "rdmad.cli", "check-config", "--config", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 6, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == "rdmad: 4 error(s) in the config:"
    assert lines[1:] == [
        f"  {d / '10-latin1.toml'}: not UTF-8 text: byte 0xe9 at line 1, column 6; "
        "TOML files must be UTF-8",
        f"  {d / '20-dir.toml'}: is a directory, not a config file",
        f"  {d / '30-loop.toml'}: cannot read: too many levels of symbolic links (a symlink loop?)",
        f"  {tmp_path / 'rdmad.toml'}:2: daemon.settle: not a duration "
        "(e.g. '150ms', '5m', '30s'): 'soon'",
    ]
    js = subprocess.run(
        [sys.executable, "-m", "rdmad.cli", "check-config", "--json", "--config", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert js.returncode == 6
    errors = json.loads(js.stdout)["error"]["errors"]
    last = (errors[-1]["file"], errors[-1]["path"])
    assert len(errors) == 4 and last == (str(tmp_path / "rdmad.toml"), "daemon.settle")


# --- rdmad plan uses the daemon's saved state, by the daemon's rule --------------------


def _state_file(path: Path, boot_id: str, managed: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "boot_id": boot_id, "managed_rxe": managed}))
    return path


@pytest.fixture
def stale_rxe(demo: tuple[Path, Path]) -> tuple[Path, Path]:
    """The demo node with an rxe link rxe9 on enp94s0f0 that the config no longer declares."""
    root, cfg = demo
    FakeSysfs(root).ib_device("rxe9", None, "52:54:00:ff:fe:12:34:56", netdev="enp94s0f0")
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-2\n")
    return root, cfg


def test_plan_deletes_a_link_rdmad_created_this_boot(
    stale_rxe: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, cfg = stale_rxe
    st = _state_file(tmp_path / "state" / "state.json", "boot-2", ["rxe9"])
    assert main(["plan", "--root", str(root), "--config", str(cfg), "--state", str(st)]) == 1
    out = capsys.readouterr().out
    assert f"state: {st}, written this boot: rdmad-created rxe links: rxe9" in out
    assert "[rxe rxe9] rdma link delete rxe9" in out

    assert (
        main(["plan", "--json", "--root", str(root), "--config", str(cfg), "--state", str(st)]) == 1
    )
    data = json.loads(capsys.readouterr().out)
    assert data["state"]["managed_rxe"] == ["rxe9"]
    assert [a["describe"] for a in data["actions"] if a["kind"] == "delete-rxe"] == [
        "rdma link delete rxe9"
    ]


def test_plan_with_a_state_from_another_boot_deletes_nothing(
    stale_rxe: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, cfg = stale_rxe
    st = _state_file(tmp_path / "state.json", "boot-1", ["rxe9"])
    assert main(["plan", "--root", str(root), "--config", str(cfg), "--state", str(st)]) == 1
    out = capsys.readouterr().out
    assert f"state: {st} is from an earlier boot: rdmad owns no rxe link" in out
    assert "rxe9" not in out.split("state:")[1].split("\n", 1)[1]  # no action names it


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (None, "state: none at {st}: rdmad owns no rxe link"),
        ("{not json", "state: state file {st} is corrupt ("),
        ('{"version": 1, "managed_rxe": ["rxe9"]}', "state: {st} (the boot it was written in"),
    ],
)
def test_plan_without_a_usable_state_owns_nothing_and_changes_nothing(
    stale_rxe: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    line: str,
) -> None:
    root, cfg = stale_rxe
    st = tmp_path / "state.json"
    if content is not None:
        st.write_text(content)
    assert (
        main(["plan", "--json", "--root", str(root), "--config", str(cfg), "--state", str(st)]) == 1
    )
    data = json.loads(capsys.readouterr().out)
    assert data["state"]["line"].startswith(line.format(st=st))
    assert data["state"]["managed_rxe"] == []
    assert "delete-rxe" not in [a["kind"] for a in data["actions"]]
    assert (st.read_text() if content is not None else None) == content  # left as it was


def test_plan_default_state_is_in_the_configured_state_dir(
    stale_rxe: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = stale_rxe
    st = _state_file(tmp_path / "var" / "state.json", "boot-2", ["rxe9"])
    cfg = tmp_path / "etc"
    (cfg / "rdmad.d").mkdir(parents=True)
    (cfg / "rdmad.toml").write_text(f'[daemon]\nstate_dir = "{st.parent}"\n')
    assert main(["plan", "--json", "--root", str(root), "--config", str(cfg)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"]["file"] == str(st) and data["state"]["managed_rxe"] == ["rxe9"]
