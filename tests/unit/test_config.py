"""Config loading: merge rules, strict validation, every error named by file and key path."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad import config
from rdmad.config import ConfigInvalid, load
from rdmad.config.files import MAX_FILE_BYTES, config_files, read_document
from rdmad.model import DaemonSpec, MetricsSpec
from rdmad.pathkeys import SUN_PATH_MAX

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def unlined(text: str) -> str:
    """An error as these tests name it: without its line (test_config_lines.py checks
    those), so each test here says only what it is about."""
    return re.sub(r"(\.toml):\d+: ", r"\1: ", text)


def errors_of(location: Path) -> list[str]:
    with pytest.raises(ConfigInvalid) as exc:
        load(location)
    return [unlined(str(e)) for e in exc.value.errors]


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
        "sriov[0].vf[0].vlan: must be an integer <= 4094, not 5000",
        "sriov[0].vf[0].qos: must be an integer <= 7, not 9",
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
    path = write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 2
vf = [ { index = 1, trust = true }, { index = 1, trust = false } ]
""",
    )
    # Within one file a second declaration is a mistake, not an override: both named.
    assert errors_of(path) == [
        f"{path}: sriov[0].vf[1]: VF 1 of this PF is already declared at sriov[0].vf[0]"
    ]


def test_two_entries_for_one_pf_in_one_file_are_an_error_naming_both(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 2
vf = [ { index = 0, trust = true } ]

[[sriov]]
pf = { pci = "3b:00.0" }
vf = [ { index = 0, trust = false } ]
""",
    )
    # The rule of [[rxe]] and [[sriov.vf]]: which of the two would win is a guess.
    assert errors_of(path) == [
        f"{path}: sriov[1]: PF pci=0000:3b:00.0 is already declared at sriov[0]",
        f"{path}: sriov[1].vf[0]: VF 0 of this PF is already declared at sriov[0].vf[0]",
    ]


def test_duplicate_rxe_name_within_one_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "rdmad.toml",
        """
[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }

[[rxe]]
name = "rxe0"
netdev = { name = "eth1" }
""",
    )
    assert errors_of(path) == [f"{path}: rxe[1]: rxe 'rxe0' is already declared at rxe[0]"]


def test_a_dropin_still_overrides_what_another_file_declared(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[[rxe]]
name = "rxe0"
netdev = { name = "eth0" }

[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 2
vf = [ { index = 1, trust = true } ]
""",
    )
    write(
        tmp_path,
        "rdmad.d/10-site.toml",
        """
[[rxe]]
name = "rxe0"
netdev = { name = "eth1" }

[[sriov]]
pf = { pci = "0000:3b:00.0" }
vf = [ { index = 1, trust = false } ]
""",
    )
    d = load(tmp_path).desired
    assert [r.netdev.name for r in d.rxe] == ["eth1"]
    assert [(v.index, v.trust) for v in d.sriov[0].vf] == [(1, False)]


def test_one_mac_for_two_vfs_of_a_pf_names_both_places(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 3
vf = [ { index = 0, mac = "02:00:00:00:00:01" }, { index = 1, mac = "02:00:00:00:00:01" } ]

[[sriov]]
pf = { pci = "0000:3c:00.0" }
numvfs = 1
vf = [ { index = 0, mac = "02:00:00:00:00:01" } ]  # a bonded pair across ports: allowed
""",
    )
    dropin = write(
        tmp_path,
        "rdmad.d/10-other.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
vf = [ { index = 2, mac = "02:00:00:00:00:01" } ]
""",
    )
    mac = "MAC 02:00:00:00:00:01 is also declared at"
    assert errors_of(tmp_path) == [
        f"{main}: sriov[0].vf[1].mac: {mac} sriov[0].vf[0].mac",
        f"{dropin}: sriov[0].vf[0].mac: {mac} {main}: sriov[0].vf[0].mac",
    ]


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
    ("value", "seconds"),
    [
        ("150ms", 0.15),
        ("5m", 300),
        ("2s", 2),
        (3, 3),
        ("1.5h", 5400),
        # systemd's spellings, as in a unit's RestartSec= or a timer
        ("5min", 300),
        ("1h 30s", 3630),
        ("1min30s", 90),
        ("90sec", 90),
        ("2 hours", 7200),
        ("1d", 86400),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    from rdmad.model import parse_duration

    assert parse_duration(value) == pytest.approx(seconds)


def test_default_location_constant() -> None:
    assert Path("/etc/rdmad") == config.DEFAULT_DIR


# --- files that cannot be read are config errors, never exceptions ----------------------

GOOD = '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n'


def test_non_utf8_dropin_is_an_error_naming_file_line_and_byte(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", GOOD)
    bad = tmp_path / "rdmad.d" / "20-latin1.toml"
    bad.parent.mkdir()
    bad.write_bytes(b'[[rxe]]\nname = "caf\xe9"\n')
    [err] = errors_of(tmp_path)
    assert err == f"{bad}: not UTF-8 text: byte 0xe9 at line 2, column 12; TOML files must be UTF-8"


def test_dropin_that_is_a_directory_fifo_or_dangling_link(tmp_path: Path) -> None:
    d = tmp_path / "rdmad.d"
    (d / "10-dir.toml").mkdir(parents=True)
    os.mkfifo(d / "20-fifo.toml")  # opening it for reading would block without O_NONBLOCK
    (d / "30-dangling.toml").symlink_to(tmp_path / "gone.toml")
    errs = errors_of(tmp_path)
    assert errs == [
        f"{d / '10-dir.toml'}: is a directory, not a config file",
        f"{d / '20-fifo.toml'}: is a FIFO, not a config file",
        f"{d / '30-dangling.toml'}: cannot read: no such file or directory "
        "(removed, or a dangling symlink)",
    ]


def test_symlink_loops_config_dir_dropin_dir_and_file(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    [err] = errors_of(loop)
    assert err == f"{loop}: cannot read: too many levels of symbolic links (a symlink loop?)"

    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "rdmad.d").symlink_to(cfg / "rdmad.d")
    [err] = errors_of(cfg)
    assert err.startswith(f"{cfg / 'rdmad.d'}: cannot read: too many levels")

    (cfg / "rdmad.d").unlink()
    (cfg / "rdmad.d").mkdir()
    (cfg / "rdmad.d" / "a.toml").symlink_to(cfg / "rdmad.d" / "b.toml")
    (cfg / "rdmad.d" / "b.toml").symlink_to(cfg / "rdmad.d" / "a.toml")
    errs = errors_of(cfg)
    assert len(errs) == 2 and all("symlink loop" in e for e in errs)


def test_dropin_dir_that_is_a_file_or_unlistable(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.d", "not a directory")
    [err] = errors_of(tmp_path)
    assert err == f"{tmp_path / 'rdmad.d'}: cannot read: Not a directory"


def test_file_removed_between_listing_and_reading(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", GOOD)
    gone = write(tmp_path, "rdmad.d/10-gone.toml", GOOD)
    files = config_files(tmp_path)
    assert gone in files
    gone.unlink()  # what a package upgrade or an editor's rename does under a reload
    errs = [read_document(p)[1] for p in files]
    assert [str(e) for e in errs if e is not None] == [
        f"{gone}: cannot read: no such file or directory (removed, or a dangling symlink)"
    ]


def test_file_over_the_size_limit(tmp_path: Path) -> None:
    big = write(tmp_path, "rdmad.toml", "# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    assert big.stat().st_size > MAX_FILE_BYTES
    [err] = errors_of(tmp_path)
    assert err == f"{big}: larger than the 1 MiB limit for a config file"


def test_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    body = GOOD + "#" * (MAX_FILE_BYTES - len(GOOD) - 1) + "\n"
    write(tmp_path, "rdmad.toml", body)
    assert load(tmp_path).desired.rxe[0].name == "rxe0"


def test_empty_files_declare_nothing(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", "")
    write(tmp_path, "rdmad.d/10-empty.toml", "")
    loaded = load(tmp_path)
    assert len(loaded.files) == 2 and loaded.desired.rxe == () and loaded.desired.sriov == ()


def test_nesting_too_deep_for_the_parser(tmp_path: Path) -> None:
    bad = write(tmp_path, "rdmad.toml", "x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    [err] = errors_of(tmp_path)
    assert err.startswith(f"{bad}: not valid TOML")


def test_hidden_and_other_names_are_not_config_files(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.d/10-a.toml", GOOD)
    (tmp_path / "rdmad.d" / ".#10-a.toml").symlink_to("user@host.1234")  # an editor's lock
    write(tmp_path, "rdmad.d/.50-snapshot.toml.tmp", "garbage =")
    write(tmp_path, "rdmad.d/10-a.toml.dpkg-old", "garbage =")
    assert load(tmp_path).files == (str(tmp_path / "rdmad.d" / "10-a.toml"),)


def test_undecodable_file_name_is_printable(tmp_path: Path) -> None:
    d = tmp_path / "rdmad.d"
    d.mkdir()
    raw = os.path.join(os.fsencode(d), b"10-\xff.toml")
    with open(raw, "wb") as fh:
        fh.write(b"[daemon]\nsettle = 'soon'\n")
    [err] = errors_of(tmp_path)
    assert "10-\\xff.toml: daemon.settle:" in err
    err.encode("utf-8")  # printable and loggable as UTF-8: no lone surrogates left


def test_main_file_unreadable_without_permission() -> None:
    """EACCES as an unprivileged reader sees it (root reads anything: a child drops to nobody)."""
    tmp = Path(tempfile.mkdtemp())
    try:
        tmp.chmod(0o755)
        main = write(tmp, "rdmad.toml", GOOD)
        main.chmod(0)
        errs = _errors_as_nobody(tmp)
        assert errs == [f"{main}: cannot read: Permission denied"]
    finally:
        shutil.rmtree(tmp)


def _errors_as_nobody(location: Path) -> list[str]:
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, load, report over the pipe, never return
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            try:
                load(location)
                out = ["loaded"]
            except ConfigInvalid as exc:
                out = [str(e) for e in exc.errors]
            os.write(write_end, "\n".join(out).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read, "rb") as fh:
        data = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data.splitlines()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_config_or_config_errors(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rdmad.toml"
        path.write_bytes(data)
        try:
            load(Path(tmp))
        except ConfigInvalid as exc:
            assert exc.errors and all(e.file == str(path) for e in exc.errors)


TOML_VALUES = st.recursive(
    st.none().map(lambda _: 0)
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.text(max_size=20)
    | st.sampled_from(["02:00:00:00:00:01", "0000:3b:00.0", "none", "report", "apply", "5m"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(
            ["name", "netdev", "pf", "pci", "numvfs", "vf", "index", "mac", "vlan", "driver",
             "in_use_drift", "rxe", "sriov", "daemon", "settle", "mode", "peermem"]
        ),
        inner,
        max_size=4,
    ),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["rxe", "sriov", "daemon", "peermem", "x"]),
                                TOML_VALUES, max_size=3), max_size=3))  # fmt: skip
def test_any_shapes_merge_into_a_config_or_config_errors(docs: list[dict[str, object]]) -> None:
    desired, errors = config.parse([(f"f{i}.toml", d) for i, d in enumerate(docs)])
    assert (desired is None) == bool(errors)
    assert all(e.file in {f"f{i}.toml" for i in range(len(docs))} for e in errors)


# --- in_use_drift and driver = "none" merge like other keys -----------------------------


def test_in_use_drift_and_driver_none_merge_by_identity(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        """
[[sriov]]
pf = { pci = "0000:3b:00.0" }
numvfs = 3
[[sriov.vf]]
index = 0
driver = "none"
[[sriov.vf]]
index = 1
in_use_drift = "apply"
""",
    )
    write(
        tmp_path,
        "rdmad.d/50-vm-host.toml",
        """
[[sriov]]
pf = { pci = "3b:00.0" }
in_use_drift = "apply"
[[sriov.vf]]
index = 1
in_use_drift = "report"
[[sriov.vf]]
index = 2
driver = "none"
""",
    )
    [s] = load(tmp_path).desired.sriov
    assert s.in_use_drift == "apply"
    assert [(v.index, v.driver, v.in_use_drift) for v in s.vf] == [
        (0, "none", None),  # unset: follows the PF's "apply"
        (1, None, "report"),
        (2, "none", None),
    ]


def test_in_use_drift_bad_value_names_file_and_key(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", '[[sriov]]\npf = { pci = "0000:3b:00.0" }\nnumvfs = 1\n')
    bad = write(
        tmp_path,
        "rdmad.d/10-x.toml",
        '[[sriov]]\npf = { pci = "0000:3b:00.0" }\nin_use_drift = "always"\n'
        "[[sriov.vf]]\nindex = 0\nin_use_drift = true\n",
    )
    errs = errors_of(tmp_path)
    assert any(e.startswith(f"{bad}: sriov[0].in_use_drift: ") for e in errs), errs
    assert any(e.startswith(f"{bad}: sriov[0].vf[0].in_use_drift: ") for e in errs), errs


def test_daemon_settings_survive_a_broken_dropin(tmp_path: Path) -> None:
    """Logging and the state dir are chosen before the agent loads (and rejects) the config."""
    write(
        tmp_path,
        "rdmad.toml",
        '[daemon]\nstate_dir = "/srv/rdmad-state"\nlog_level = "debug"\nsettle = "soon"\n',
    )
    (tmp_path / "rdmad.d").mkdir()
    (tmp_path / "rdmad.d" / "10-bad.toml").write_bytes(b"[daemon]\nlog_format = '\xff'\n")
    write(tmp_path, "rdmad.d/20-ok.toml", '[daemon]\nlog_format = "json"\n[[sriov]]\nnumvfs = 1\n')
    spec = config.start_settings(tmp_path).daemon
    got = (spec.state_dir, spec.log_level, spec.log_format)
    assert got == ("/srv/rdmad-state", "debug", "json")
    assert spec.settle == DaemonSpec().settle  # the invalid value falls back to the default
    assert config.start_settings(tmp_path / "missing").daemon == DaemonSpec()


def test_metrics_settings_survive_an_invalid_config(tmp_path: Path) -> None:
    """Metrics stay on (and where the admin put them) whatever else is wrong."""
    write(
        tmp_path,
        "rdmad.toml",
        '[metrics]\nlisten = "[::1]:9478"\ntextfile_interval = "1ms"\n[[sriov]]\nnumvfs = 1\n',
    )
    write(tmp_path, "rdmad.d/20-more.toml", '[metrics]\ntextfile_dir = "/var/lib/node_exporter"\n')
    with pytest.raises(config.ConfigInvalid):
        config.load(tmp_path)
    spec = config.start_settings(tmp_path).metrics
    assert (spec.listen, spec.textfile_dir) == ("[::1]:9478", "/var/lib/node_exporter")
    assert spec.textfile_interval == MetricsSpec().textfile_interval  # 1ms: below the minimum
    assert config.start_settings(tmp_path / "missing").metrics == MetricsSpec()


def test_api_settings_survive_an_invalid_config(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", '[api]\nsocket = "/tmp/x.sock"\nread_group = "bad group!"\n')
    write(tmp_path, "rdmad.d/10-broken.toml", "[daemon]\nsettle = 'soon'\n[[rxe]]\nname = 1\n")
    spec = config.start_settings(tmp_path).api
    assert spec.socket == "/tmp/x.sock"
    assert spec.read_group == "rdmad"  # the invalid key alone falls back to its default
    assert config.start_settings(tmp_path / "missing").api.socket == "/run/rdmad/rdmad.sock"


LONG_SOCKET = "/run/" + "s" * 97 + ".sock"  # 107 bytes: sun_path's limit
assert len(LONG_SOCKET) == SUN_PATH_MAX


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("daemon.state_dir", "var/lib/rdmad", "must be an absolute path"),
        ("daemon.state_dir", "", "must be an absolute path"),
        ("metrics.textfile_dir", "./prom", "must be an absolute path"),
        ("api.socket", "rdmad.sock", "must be an absolute path"),
        ("api.socket", LONG_SOCKET + "x", "at most 107 bytes, this one 108"),
        ("api.socket", "/run/" + "é" * 50 + ".sock", "at most 107 bytes, this one 110"),
        ("api.socket", "/run/a\\u0000b.sock", "must not hold a NUL byte"),  # a TOML escape
    ],
)
def test_a_path_that_is_relative_or_does_not_fit_is_an_error_and_its_default_is_used(
    tmp_path: Path, key: str, value: str, words: str
) -> None:
    """A relative path hung on the daemon's working directory (/ under systemd); a socket
    path past sun_path could not be bound, leaving the node without its API."""
    section, name = key.split(".")
    write(tmp_path, "rdmad.toml", f'[{section}]\n{name} = "{value}"\n')
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path)
    (err,) = caught.value.errors
    assert err.path == key and words in err.message, err
    settings = config.start_settings(tmp_path)
    assert getattr(getattr(settings, section), name) == getattr(
        getattr(config.start_settings(tmp_path / "missing"), section), name
    )


def test_absolute_paths_and_a_socket_path_of_107_bytes_are_taken(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rdmad.toml",
        f'[daemon]\nstate_dir = "/srv/rdmad"\n[api]\nsocket = "{LONG_SOCKET}"\n'
        '[metrics]\ntextfile_dir = "/var/lib/node_exporter"\n',
    )
    desired = load(tmp_path).desired
    assert desired.daemon.state_dir == "/srv/rdmad"
    assert desired.api.socket == LONG_SOCKET
    assert desired.metrics.textfile_dir == "/var/lib/node_exporter"


def test_effective_config_names_each_values_file_and_key(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "rdmad.toml",
        '[[sriov]]\npf = { pci = "0000:3b:00.0" }\nnumvfs = 2\n'
        '[[sriov.vf]]\nindex = 0\nmac = "02:00:00:00:00:01"\n',
    )
    dropin = write(
        tmp_path,
        "rdmad.d/10-vfs.toml",
        '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n'
        '[[sriov]]\npf = { pci = "0000:3b:00.0" }\nnumvfs = 4\n',
    )
    eff = config.effective(tmp_path)
    assert eff.ok and eff.files == (str(main), str(dropin))
    values = {v.key: v for v in eff.values}
    assert (values["sriov[0].numvfs"].value, values["sriov[0].numvfs"].file) == (4, str(dropin))
    assert values["sriov[0].numvfs"].file_key == "sriov[0].numvfs"
    assert values["sriov[0].vf[0].mac"].file == str(main)
    assert values["sriov[0].pf.pci"].value == "0000:3b:00.0"
    assert values["rxe[0].netdev.name"].file_key == "rxe[0].netdev.name"
    assert eff.merged["sriov"][0]["numvfs"] == 4


def test_effective_config_shows_an_invalid_config_with_its_errors(tmp_path: Path) -> None:
    write(tmp_path, "rdmad.toml", "[daemon]\nsettle = 'soon'\n")
    write(tmp_path, "rdmad.d/20-broken.toml", "[daemon\n")
    eff = config.effective(tmp_path)
    assert not eff.ok
    text = [str(e) for e in eff.errors]
    assert any("20-broken.toml: not valid TOML" in e for e in text)
    assert any("rdmad.toml:2: daemon.settle" in e for e in text)
    assert [(v.key, v.value) for v in eff.values] == [("daemon.settle", "soon")]
