"""The config the package installs declares nothing, and so changes nothing and alerts on
nothing, on a GPU node too: `rdmad plan` of it against GPU nodes (peermem loadable,
and no peer-memory module at all) is empty and converged. What a GPU node wants is the
one line the file shows, commented out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmad.cli import main
from tests.support.fakesysfs import gpu_node

SHIPPED = Path(__file__).resolve().parents[2] / "packaging" / "rdmad.toml"


def plan_json(root: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["plan", "--local", "--json", "--root", str(root), "--config", str(config)]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


@pytest.fixture
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RDMAD_SOCKET", str(tmp_path / "no-daemon.sock"))
    d = tmp_path / "etc"
    d.mkdir()
    (d / "rdmad.toml").write_text(SHIPPED.read_text())
    return d


@pytest.mark.parametrize(
    "installed",
    [None, {}],
    ids=["peermem-installed", "no-peermem-module"],
)
def test_the_shipped_config_changes_nothing_on_a_gpu_node(
    tmp_path: Path,
    etc: Path,
    installed: dict[str, bytes] | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fs = gpu_node(tmp_path / "root", installed=installed)
    # MOFED/DOCA's openibd.service is there too: no guard is declared, so no drop-in.
    fs.write("lib/systemd/system/openibd.service", "[Service]\nExecStop=/etc/init.d/openibd stop")
    doc = plan_json(fs.root, etc, capsys)
    assert doc["actions"] == []  # no `modprobe nvidia-peermem`
    assert doc["objects"] == []  # nothing blocked or degraded: nothing to alert on
    assert doc["notes"] == []


def test_the_gpu_line_the_shipped_config_shows_loads_peermem(
    tmp_path: Path, etc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = SHIPPED.read_text()
    assert '# [peermem]\n# mode = "auto"' in shipped
    (etc / "rdmad.toml").write_text(
        shipped.replace('# [peermem]\n# mode = "auto"', '[peermem]\nmode = "auto"')
    )
    root = gpu_node(tmp_path / "root").root
    [action] = plan_json(root, etc, capsys)["actions"]  # type: ignore[misc]
    assert (action["obj"], action["describe"]) == ("peermem", "modprobe nvidia-peermem")
