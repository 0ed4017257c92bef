"""`rdmad-ctl doctor` with fleet selectors (``[[sriov]] select = {...}``) on fake trees:
each selector resolved against the SR-IOV PFs present with the daemon's rule, each
matched PF checked as a literal one is (VF count, eSwitch, other managers), a selector
that matches nothing here said as info, a literal pf winning over a selector."""

from __future__ import annotations

import json
from pathlib import Path

from rdmad.doctor import Root, run_checks
from rdmad.doctor.eswitch import Seen
from rdmad.doctor.report import Check
from tests.ctl.conftest import ctl
from tests.support.fakesysfs import FakeSysfs

IGB = "0000:01:00.0"
CX = "0000:3b:00.0"
SELECT_IGB = '[[sriov]]\nselect = { vendor = "8086", device = "10c9" }\nnumvfs = 4\n'
NAME = "select:vendor=8086,device=10c9"


def fleet_node(root: Path) -> FakeSysfs:
    """An igb PF (8086:10c9, up to 7 VFs) and a ConnectX-5 PF (15b3:1017) beside it."""
    fs = FakeSysfs(root)
    fs.pf(IGB, "igb", totalvfs=7, vendor="0x8086", device="0x10c9")
    fs.netdev("enp1s0", IGB, "52:54:00:12:34:56")
    fs.pf(CX, "mlx5_core", totalvfs=16, vendor="0x15b3", device="0x1017")
    fs.netdev("ens3f0np0", CX, "b8:ce:f6:2e:a6:70")
    return fs


def checks(tmp_path: Path, *files: str, devlink: object = None) -> dict[str, Check]:
    """The doctor's checks with ``files`` as rdmad.toml and then drop-ins, in order."""
    etc = tmp_path / "etc"
    (etc / "rdmad.d").mkdir(parents=True, exist_ok=True)
    (etc / "rdmad.toml").write_text(files[0])
    for old in (etc / "rdmad.d").iterdir():
        old.unlink()
    for n, text in enumerate(files[1:]):
        (etc / f"rdmad.d/{n:02}.toml").write_text(text)
    report = run_checks(Root(str(tmp_path / "root")), str(etc), devlink)  # type: ignore[arg-type]
    return {c.id: c for c in report.checks}


def test_a_selector_checks_the_pfs_it_matches_and_only_them(tmp_path: Path) -> None:
    fleet_node(tmp_path / "root")
    sriov = checks(tmp_path, SELECT_IGB)["sriov"]
    assert (sriov.status, sriov.summary) == ("ok", "1 declared PF(s) SR-IOV capable")
    assert sriov.evidence == (f"pf {NAME} ({IGB}, igb): up to 7 VFs, autoprobe 1",)
    # More VFs than the matched PF has: as for a literal pf.
    sriov = checks(tmp_path, SELECT_IGB.replace("numvfs = 4", "numvfs = 8"))["sriov"]
    assert (sriov.status, sriov.summary) == ("fail", "1 of 1 declared PF(s) cannot take their VFs")
    assert sriov.evidence == (f"pf {NAME} ({IGB}, igb): up to 7 VFs, 8 declared, autoprobe 1",)


def test_table_and_json_for_a_selectors_only_file(tmp_path: Path) -> None:
    """What an operator sees: the matched PF, not "no PF declared"; JSON keys as ever."""
    fleet_node(tmp_path / "root")
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rdmad.toml").write_text(SELECT_IGB)
    args = ("doctor", "--root", str(tmp_path / "root"), "--config", str(etc))
    table = ctl(*args)
    assert "sriov           ok      1 declared PF(s) SR-IOV capable" in table.out
    doc = json.loads(ctl(*args, "--json").out)
    [sriov] = [c for c in doc["checks"] if c["check"] == "sriov"]
    assert set(sriov) >= {"check", "status", "summary", "evidence"}
    assert sriov["status"] == "ok"
    assert sriov["evidence"] == [f"pf {NAME} ({IGB}, igb): up to 7 VFs, autoprobe 1"]


def test_a_selector_that_matches_nothing_here_is_info(tmp_path: Path) -> None:
    fleet_node(tmp_path / "root")
    toml = '[[sriov]]\nselect = { vendor = "15b3", device = ["101d", "101e"] }\nnumvfs = 4\n'
    found = checks(tmp_path, toml)
    sriov = found["sriov"]
    assert (sriov.status, sriov.summary) == (
        "info",
        "no declared PF here: 1 selector(s), nothing to do",
    )
    assert sriov.evidence == (
        "select:vendor=15b3,device=101d|101e: matches no PF here (vendor 15b3, device 101d "
        "or 101e): nothing to do",
    )
    assert "other-managers" not in found and "eswitch" not in found
    table = ctl("doctor", "--root", str(tmp_path / "root"), "--config", str(tmp_path / "etc"))
    assert "sriov           info    no declared PF here: 1 selector(s), nothing to do" in table.out


def test_a_pf_with_no_driver_a_selector_could_match_is_named(tmp_path: Path) -> None:
    """As the daemon's note says it: a driver unloaded (or none loaded for it) leaves a
    PF that a `driver` selector matches once it is bound again."""
    fs = FakeSysfs(tmp_path / "root")
    fs.pf(IGB, "", totalvfs=7, vendor="0x8086", device="0x10c9")  # no driver bound
    toml = '[[sriov]]\nselect = { driver = "igb" }\nnumvfs = 2\n'
    sriov = checks(tmp_path, toml)["sriov"]
    assert sriov.status == "info"
    assert sriov.evidence == (
        f"select:driver=igb: matches no PF here now (driver igb); {IGB} has no driver bound "
        "and may match once one is: nothing to do until then",
    )
    # A selector it cannot match (another vendor's) says nothing of it.
    toml = '[[sriov]]\nselect = { vendor = "15b3", driver = "mlx5_core" }\nnumvfs = 2\n'
    assert checks(tmp_path, toml)["sriov"].evidence == (
        "select:vendor=15b3,driver=mlx5_core: matches no PF here (vendor 15b3, driver "
        "mlx5_core): nothing to do",
    )


def test_at_boot_a_pf_udev_has_not_processed_is_said_to_be_awaited(tmp_path: Path) -> None:
    """udevd runs (its control socket) and has no entry for the PF yet: coldplug may
    still load its driver, so the doctor says what the daemon does (it waits), for a
    selector that could match it and for a literal pf; once udev has processed it, the
    words of a PF that simply has no driver."""
    root = tmp_path / "root"
    fs = FakeSysfs(root)
    fs.pf(IGB, "", totalvfs=7, vendor="0x8086", device="0x10c9")  # no driver bound
    (root / "run/udev/data").mkdir(parents=True)
    (root / "run/udev/control").write_text("")
    toml = '[[sriov]]\nselect = { driver = "igb" }\nnumvfs = 2\n'
    sriov = checks(tmp_path, toml)["sriov"]
    assert sriov.status == "info"
    assert sriov.evidence == (
        f"select:driver=igb: matches no PF here yet (driver igb); {IGB} has no driver bound "
        "yet and udev has not processed it (at boot): it may match once its driver is bound "
        "(rdmad waits for it)",
    )
    literal = f'[[sriov]]\npf = {{ pci = "{IGB}" }}\nnumvfs = 2\n'
    assert checks(tmp_path, literal)["sriov"].evidence == (
        f"pf pci={IGB} ({IGB}, no driver yet: udev has not processed it (at boot)): "
        "up to 7 VFs, autoprobe 1",
    )

    (root / f"run/udev/data/+pci:{IGB}").write_text("")  # processed: no driver for it
    assert checks(tmp_path, toml)["sriov"].evidence == (
        f"select:driver=igb: matches no PF here now (driver igb); {IGB} has no driver bound "
        "and may match once one is: nothing to do until then",
    )
    assert checks(tmp_path, literal)["sriov"].evidence == (
        f"pf pci={IGB} ({IGB}, no driver): up to 7 VFs, autoprobe 1",
    )


def test_where_udevd_cannot_be_looked_up_the_doctor_says_what_the_daemon_does(
    tmp_path: Path,
) -> None:
    """A lookup under /run/udev that fails other than ENOENT (here ELOOP) is unknown,
    never "no udevd": the PF is awaited as at boot, in words that say it is unknown, and
    the report names the path."""
    root = tmp_path / "root"
    fs = FakeSysfs(root)
    fs.pf(IGB, "", totalvfs=7, vendor="0x8086", device="0x10c9")  # no driver bound
    (root / "run").mkdir(exist_ok=True)
    (root / "run/udev").symlink_to("udev")  # a loop: every lookup under it fails
    literal = f'[[sriov]]\npf = {{ pci = "{IGB}" }}\nnumvfs = 2\n'
    etc = tmp_path / "etc"
    (etc / "rdmad.d").mkdir(parents=True)
    (etc / "rdmad.toml").write_text(literal)
    report = run_checks(Root(str(root)), str(etc), None)
    sriov = next(c for c in report.checks if c.id == "sriov")
    assert sriov.evidence == (
        f"pf pci={IGB} ({IGB}, no driver; whether udev has processed it is unknown "
        "(/run/udev/control could not be read)): up to 7 VFs, autoprobe 1",
    )
    assert "/run/udev/control: Too many levels of symbolic links" in report.unread
    # A selector that could match it: awaited, in the same words.
    (etc / "rdmad.toml").write_text('[[sriov]]\nselect = { driver = "igb" }\nnumvfs = 2\n')
    sriov = next(c for c in run_checks(Root(str(root)), str(etc), None).checks if c.id == "sriov")
    assert any(
        "has no driver bound, and whether udev has processed it is unknown "
        "(/run/udev/control could not be read): it may match once its driver is bound" in line
        for line in sriov.evidence
    ), sriov.evidence


def test_patterns_ids_and_netdev_names_as_the_daemon_reads_them(tmp_path: Path) -> None:
    fleet_node(tmp_path / "root")
    toml = (
        '[[sriov]]\nselect = { vendor = "0x15B3", driver = "mlx5_*", name = "ens3f*" }\n'
        'numvfs = 2\n\n[[sriov]]\nselect = { pci_path = "0000:01:*", driver = "ixgbe" }\n'
        "numvfs = 2\n"
    )
    sriov = checks(tmp_path, toml)["sriov"]
    assert sriov.status == "ok"
    assert sriov.evidence == (
        f"pf select:vendor=15b3,driver=mlx5_*,name=ens3f* ({CX}, mlx5_core): up to 16 VFs, "
        "autoprobe 1",
        "select:driver=ixgbe,pci_path=0000:01:*: matches no PF here (driver ixgbe, pci path "
        "0000:01:*): nothing to do",
    )


def test_a_literal_pf_wins_over_a_selector_and_drop_ins_merge_by_selector(
    tmp_path: Path,
) -> None:
    fleet_node(tmp_path / "root")
    literal = f'[[sriov]]\npf = {{ pci = "{IGB}" }}\nnumvfs = 2\n'
    sriov = checks(tmp_path, SELECT_IGB, literal)["sriov"]
    assert sriov.status == "ok"
    assert sriov.evidence == (
        f"pf pci={IGB} ({IGB}, igb): up to 7 VFs, autoprobe 1",
        f"{NAME}: the PFs it matches are declared by a literal pf, which wins over a "
        f"selector: {IGB}",
    )
    # A drop-in naming the same selector (written another way) overrides its keys.
    later = '[[sriov]]\nselect = { device = ["0x10C9"], vendor = "8086" }\nnumvfs = 9\n'
    sriov = checks(tmp_path, SELECT_IGB, later)["sriov"]
    assert sriov.status == "fail" and sriov.evidence[0].endswith("9 declared, autoprobe 1")


def test_two_selectors_on_one_pf_and_an_unreadable_selector_fail(tmp_path: Path) -> None:
    fleet_node(tmp_path / "root")
    toml = SELECT_IGB + '\n[[sriov]]\nselect = { driver = "igb" }\nnumvfs = 2\n'
    sriov = checks(tmp_path, toml)["sriov"]
    assert (sriov.status, sriov.summary) == ("fail", "1 of 1 declared PF(s) cannot take their VFs")
    assert sriov.evidence == (
        f"pf {IGB}: matched by 2 selectors ({NAME} and select:driver=igb): rdmad applies "
        f'none; narrow them, or name it with pf = {{ pci = "{IGB}" }}',
    )
    bad = checks(tmp_path, '[[sriov]]\nselect = { vendor = "intel" }\nnumvfs = 2\n')["sriov"]
    assert bad.status == "fail"
    assert bad.evidence == (
        'select = { vendor = "intel" }: not a selector rdmad reads: vendor: not a PCI ID '
        "(want 4 hex digits, e.g. '15b3'): 'intel'",
    )


def test_other_managers_of_a_selector_matched_pf_and_its_owner(tmp_path: Path) -> None:
    fs = fleet_node(tmp_path / "root")
    assert checks(tmp_path, SELECT_IGB)["other-managers"].summary == (
        "no other network manager declares SR-IOV for the 1 declared PF(s)"
    )
    fs.write(
        "etc/NetworkManager/system-connections/lan.nmconnection",
        "[connection]\nid=lan\ntype=ethernet\ninterface-name=enp1s0\n[sriov]\ntotal-vfs=2\n",
    )
    held = checks(tmp_path, SELECT_IGB)["other-managers"]
    assert (held.status, held.summary) == (
        "warn",
        "1 declared PF(s) held: rdmad writes nothing to them",
    )
    assert held.evidence == (
        f"pf {NAME} ({IGB}): NetworkManager declares SR-IOV for this PF in "
        "/etc/NetworkManager/system-connections/lan.nmconnection ([sriov] total-vfs=2)",
    )
    # The selector's owner applies to the PFs it matches.
    taken = checks(tmp_path, SELECT_IGB + 'owner = "rdmad"\n')["other-managers"]
    assert taken.status == "warn" and "taken over" in taken.summary


def test_eswitch_of_a_selector_matched_pf(tmp_path: Path) -> None:
    fleet_node(tmp_path / "root")
    toml = '[[sriov]]\nselect = { vendor = "15b3" }\nnumvfs = 2\neswitch = { mode = "switchdev" }\n'
    asked: list[str] = []

    def devlink(pf: str) -> Seen:
        asked.append(pf)
        return Seen("legacy")

    eswitch = checks(tmp_path, toml, devlink=devlink)["eswitch"]
    assert asked == [CX]
    assert eswitch.status == "warn"
    assert eswitch.evidence == (
        f"pf select:vendor=15b3 ({CX}): mode legacy; declared mode switchdev",
    )


def test_a_netdevsim_pf_matched_by_its_name(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path / "root")
    fs.write("sys/bus/netdevsim/devices/netdevsim41/sriov_numvfs", "0")
    fs.write("sys/bus/netdevsim/devices/netdevsim41/net/eni41np1/dev_port", "0")
    fs.link("sys/class/net/eni41np1", "../../bus/netdevsim/devices/netdevsim41/net/eni41np1")
    sriov = checks(tmp_path, '[[sriov]]\nselect = { name = "eni41*" }\nnumvfs = 2\n')["sriov"]
    assert sriov.status == "ok"
    assert sriov.evidence == ("pf select:name=eni41* (netdevsim41): a netdevsim test device",)
