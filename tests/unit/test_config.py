"""Config loading: merge rules, strict validation, every error named by file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad import config
from rdmad.config import ConfigInvalid, load

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def errors_of(location: Path) -> list[str]:
    with pytest.raises(ConfigInvalid) as exc:
        load(location)
    return [str(e) for e in exc.value.errors]


def test_shipped_example_validates() -> None:
    loaded = load(REPO / "etc/rdmad/rdmad.toml")
    d = loaded.desired
    assert d.daemon.settle == pytest.approx(0.15) and d.daemon.drift_interval == 300
    assert d.sriov[0].vf[1].driver == "vfio-pci"
    assert d.rxe[0].netdev.name == "eth0"


def test_empty_dir_declares_nothing(tmp_path: Path) -> None:
    loaded = load(tmp_path)
    assert loaded.files == () and loaded.desired.sriov == () and loaded.desired.rxe == ()


def test_missing_location_is_an_error(tmp_path: Path) -> None:
    [err] = errors_of(tmp_path / "nope")
    assert "no such file" in err


BAD = """
[daemon]
settle = "soon"
surprise = 1

[[sriov]]
pf = { pci = "3b:00" }
numvfs = 2
[[sriov.vf]]
index = 0
mac = "01:00:5e:00:00:01"
vlan = 5000
qos = 9
[[sriov.vf]]
index = 1
mac = "00:00:00:00:00:00"
node_guid = "00:11"

[[rxe]]
name = "rxe0"
netdev = { name = "eth0", mac = "02:00:00:00:00:01" }
"""


def test_every_error_reported_with_file_and_path(tmp_path: Path) -> None:
    path = write(tmp_path, "rdmad.toml", BAD)
    errs = errors_of(tmp_path)
    expected = [
        "daemon.settle: not a duration",
        "daemon.surprise: unknown key",
        "sriov[0].pf.pci: not a PCI address",
        "sriov[0].vf[0].mac: not a unicast MAC",
        "sriov[0].vf[0].vlan: Input should be less than or equal to 4094",
        "sriov[0].vf[0].qos: Input should be less than or equal to 7",
        "sriov[0].vf[1].mac: the all-zero MAC",
        "sriov[0].vf[1].node_guid: not a GUID",
        "rxe[0].netdev: a netdev reference needs exactly one of name, mac, pci",
    ]
    for want in expected:
        assert any(e.startswith(f"{path}: {want}") for e in errs), (want, errs)
    assert len(errs) == len(expected), errs


def test_duplicate_vf_index_and_index_beyond_numvfs(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 2
vf = [ { index = 0 }, { index = 2 } ]
""",
    )
    [err] = errors_of(tmp_path)
    assert "sriov[0]: VF index 2 does not exist with numvfs = 2" in err


def test_duplicate_vf_index_within_one_file(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 2
vf = [ { index = 1, trust = true }, { index = 1, trust = false } ]
""",
    )
    # Same index in one list is merged like a drop-in would: the later entry wins.
    d = load(tmp_path).desired
    assert [(v.index, v.trust) for v in d.sriov[0].vf] == [(1, False)]


def test_two_rxe_on_one_netdev(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "rdmad.toml",
        """
[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }
[[rxe]]
name = "rxe1"
netdev = { name = "eth0" }
""",
    )
    [err] = errors_of(tmp_path)
    assert err.startswith(f"{path}: rxe[1].netdev: netdev eth0 already carries rxe 'rxe0'")


def test_toml_syntax_error_does_not_hide_other_files(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", "[[rxe]\nname = 1\n")
    drop = write(tmp_path, "rdmad.d/10-x.toml", "[peermem]\nmode = 'sometimes'\n")
    errs = errors_of(tmp_path)
    assert any("rdmad.toml: not valid TOML" in e for e in errs)
    assert any(e.startswith(f"{drop}: peermem.mode:") for e in errs)


def test_dropins_merge_by_identity_in_name_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[daemon]
settle = "100ms"
drift_interval = "10m"
[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 4
[[sriov.vf]]
index = 0
mac = "02:00:00:00:00:01"
trust = true
""",
    )
    write(
        tmp_path,
        "rdmad.d/20-late.toml",
        """
[daemon]
settle = "300ms"
[[sriov]]
pf = { pci = "3b:00.0" }
numvfs = 8
""",
    )
    write(
        tmp_path,
        "rdmad.d/10-early.toml",
        """
[daemon]
settle = "200ms"
[[rxe]]
name = "rxe0"
netdev = { mac = "02:aa:bb:cc:dd:ee" }
[[sriov]]
pf = { pci = "0000:3b:00.0" }
[[sriov.vf]]
index = 0
trust = false
[[sriov.vf]]
index = 3
spoofchk = false
""",
    )
    loaded = load(tmp_path)
    d = loaded.desired
    assert [Path(f).name for f in loaded.files] == ["rdmad.toml", "10-early.toml", "20-late.toml"]
    assert d.daemon.settle == pytest.approx(0.3) and d.daemon.drift_interval == 600
    assert len(d.rxe) == 1 and d.rxe[0].netdev.mac == "02:aa:bb:cc:dd:ee"
    assert d.rxe[0].netdev.name is None  # nested tables are replaced whole
    [s] = d.sriov
    assert s.numvfs == 8
    vfs = {v.index: v for v in s.vf}
    assert vfs[0].mac == "02:00:00:00:00:01" and vfs[0].trust is False
    assert vfs[3].spoofchk is False


def test_error_in_dropin_names_the_dropin_path(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 4
""",
    )
    drop = write(
        tmp_path,
        "rdmad.d/10-gpu.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
[[sriov.vf]]
index = 3
mac = "01:00:5e:00:00:01"
""",
    )
    [err] = errors_of(tmp_path)
    assert err == (
        f"{drop}: sriov[0].vf[0].mac: not a unicast MAC (multicast bit set): '01:00:5e:00:00:01'"
    )


def test_wrong_shapes_are_reported_not_crashing(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", 'rxe = "eth0"\nsriov = [1, 2]\n[[bogus]]\nx = 1\n')
    errs = errors_of(tmp_path)
    assert any("rxe: " in e for e in errs)
    assert any("sriov[0]" in e for e in errs)
    assert any("bogus: unknown key" in e for e in errs)


def test_single_file_location(tmp_path: Path) -> None:
    path = write(tmp_path, "node.toml", "[peermem]\nmode = 'off'\n")
    assert load(path).desired.peermem.mode == "off"


@pytest.mark.parametrize(
    ("value", "seconds"), [("150ms", 0.15), ("5m", 300), ("2s", 2), (3, 3), ("1.5h", 5400)]
)
def test_durations(value: object, seconds: float) -> None:
    from rdmad.model import parse_duration

    assert parse_duration(value) == pytest.approx(seconds)


def test_default_location_constant() -> None:
    assert Path("/etc/rdmad") == config.DEFAULT_DIR
