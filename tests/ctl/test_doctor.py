"""`rdmad-ctl doctor` on fake sysfs/procfs trees: the table and JSON (golden), the exit
code, no tools in PATH, nothing written, only the standard library loaded."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdmad.doctor import Root, run_checks
from rdmad.doctor.report import Check
from tests.ctl.conftest import ctl, ctl_env
from tests.ctl.test_golden import check_golden
from tests.support.fakesysfs import PEERMEM_KO, RELEASE, SIGNED, FakeSysfs, gpu_node

CX = "0000:3b:00.0"
MISMATCH = (
    "4,1043,81234567,-;nvidia_peermem: disagrees about version of symbol "
    "ib_register_peer_memory_client"
)


def healthy(root: Path) -> FakeSysfs:
    """A MOFED 24.07 ConnectX node with the GPU driver and peermem loaded, iommu=pt."""
    fs = gpu_node(
        root,
        loaded=("nvidia", "nvidia_peermem", "ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib"),
        installed={PEERMEM_KO: b"ib_register_peer_memory_client" + SIGNED},
    )
    fs.write("sys/module/mlx5_core/version", "24.07-0.6.1")
    fs.write("sys/module/ib_core/parameters/netns_mode", "Y")
    fs.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=on iommu=pt")
    fs.pf(CX, "mlx5_core", totalvfs=16)
    fs.pci(CX, "mlx5_core", iommu_group=17)
    fs.netdev("ibp59s0", CX, "00:00:10:49:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:2e:a6:70")
    fs.ib_device("mlx5_0", CX, "b8ce:f603:002e:a670", netdev="ibp59s0")
    fs.write(
        f"lib/modules/{RELEASE}/modules.builtin", "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"
    )
    return fs


def broken(root: Path) -> FakeSysfs:
    """Built-in ib_core and mlx5 (no initstate, no holders) but the ConnectX function is
    unbound, so no RDMA device; modules disabled; a translated IOMMU; the GPU driver
    loaded, peermem not, and the kernel log says why."""
    fs = gpu_node(
        root,
        loaded=("nvidia",),
        builtin=("ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib"),
    )
    fs.write("proc/sys/kernel/modules_disabled", "1")
    fs.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro amd_iommu=on")
    fs.pci(CX, None, iommu_group=103)
    fs.write(f"sys/bus/pci/devices/{CX}/vendor", "0x15b3")
    fs.write("sys/kernel/iommu_groups/103/type", "DMA-FQ")
    fs.write("dev/kmsg", "\n".join(["6,1,1,-;iommu: Default domain type: Translated", MISMATCH]))
    return fs


def doctor(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    r = ctl("doctor", "--root", str(tmp_path / "root"), "--config", str(tmp_path / "etc"), *extra)
    return r.code, r.out, r.err


def test_healthy_node(tmp_path: Path) -> None:
    healthy(tmp_path / "root")
    result = ctl("doctor", "--root", str(tmp_path / "root"), "--config", str(tmp_path / "etc"))
    check_golden("doctor-healthy", ["doctor", "--root", "<ROOT>"], result, tmp_path)
    assert result.code == 0


@pytest.mark.parametrize("variant", [[], ["--json"]], ids=["table", "json"])
def test_broken_node(tmp_path: Path, variant: list[str]) -> None:
    broken(tmp_path / "root")
    result = ctl(
        "doctor", "--root", str(tmp_path / "root"), "--config", str(tmp_path / "etc"), *variant
    )
    name = "doctor-broken" + ("-json" if variant else "")
    check_golden(name, ["doctor", "--root", "<ROOT>", *variant], result, tmp_path)
    assert result.code == 1


def test_broken_node_findings(tmp_path: Path) -> None:
    broken(tmp_path / "root")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/rdmad.toml").write_text('[peermem]\nmode = "auto"\n')
    report = run_checks(Root(str(tmp_path / "root")), str(tmp_path / "etc"))
    by = {c.id: c for c in report.checks}
    assert by["rdma-devices"].status == "fail"
    assert f"{CX}: Mellanox/NVIDIA function with no driver bound" in by["rdma-devices"].evidence
    assert "built-in" in by["drivers"].summary
    assert by["iommu"].status == "warn"
    assert by["module-loading"].status == "warn"
    assert by["peermem"].status == "fail"
    ids = [f["id"] for f in by["peermem"].findings]
    assert ids[0] == "modules-disabled" and "symbol-version-mismatch" in ids


def test_translated_iommu_for_an_rdma_device(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    fs.write("proc/cmdline", "root=/dev/sda1 ro")
    fs.write("sys/kernel/iommu_groups/17/type", "DMA-FQ")
    [iommu] = [c for c in run_checks(Root(str(tmp_path / "root")), None).checks if c.id == "iommu"]
    assert iommu.status == "warn" and "mlx5_0" in iommu.summary
    assert "iommu=pt" in iommu.suggestion


def test_old_mofed_is_a_warning(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    fs.write("sys/module/mlx5_core/version", "5.8-1.1.2")
    [drv] = [c for c in run_checks(Root(str(tmp_path / "root")), None).checks if c.id == "drivers"]
    assert drv.status == "warn" and "23.10" in drv.summary


def test_declared_pfs(tmp_path: Path) -> None:
    healthy(tmp_path / "root")
    etc = tmp_path / "etc"
    (etc / "rdmad.d").mkdir(parents=True)
    (etc / "rdmad.toml").write_text(
        f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 8\n\n'
        '[[sriov]]\npf = { pci = "0000:af:00.0" }\nnumvfs = 2\n'
    )
    (etc / "rdmad.d/10-more.toml").write_text(f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 32\n')
    code, out, _ = doctor(tmp_path)
    assert code == 1
    assert "sriov           FAIL    2 of 2 declared PF(s) cannot take their VFs" in out
    assert f"pf pci={CX} ({CX}, mlx5_core): up to 16 VFs, 32 declared" in out
    assert "pf pci=0000:af:00.0: not present" in out


def test_unreadable_config_skips_pfs_and_says_so(tmp_path: Path) -> None:
    healthy(tmp_path / "root")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/rdmad.toml").write_text("[[sriov]\n")
    code, out, _ = doctor(tmp_path)
    assert "sriov           ?       declared PFs not checked:" in out and "not valid TOML" in out
    assert code == 0


def test_peermem_mode_off_from_the_config(tmp_path: Path) -> None:
    broken(tmp_path / "root")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/rdmad.toml").write_text('[peermem]\nmode = "off"\n')
    _, out, _ = doctor(tmp_path)
    assert "peermem         info    [peermem] mode = off" in out


def test_undeclared_peermem_is_said_not_a_failure(tmp_path: Path) -> None:
    """The shipped config declares no [peermem]: rdmad leaves peer memory alone, so the
    doctor says what declaring it would meet (the same findings) without failing."""
    broken(tmp_path / "root")
    config = tmp_path / "etc"
    config.mkdir()
    by = {c.id: c for c in run_checks(Root(str(tmp_path / "root")), str(config)).checks}
    assert by["peermem"].status == "info"
    assert by["peermem"].summary.startswith("not declared (rdmad leaves it alone); ")
    assert next(f["id"] for f in by["peermem"].findings) == "modules-disabled"
    assert 'declare [peermem] mode = "auto"' in by["peermem"].suggestion
    (config / "rdmad.toml").write_text('[peermem]\nmode = "auto"\n')
    by = {c.id: c for c in run_checks(Root(str(tmp_path / "root")), str(config)).checks}
    assert by["peermem"].status == "fail"


def test_undeclared_peermem_on_a_node_without_a_gpu_gives_no_advice(tmp_path: Path) -> None:
    gpu_node(tmp_path / "root", loaded=("ib_core",))
    checks = run_checks(Root(str(tmp_path / "root")), None).checks
    [check] = [c for c in checks if c.id == "peermem"]
    assert check.status == "info" and check.suggestion == ""


@pytest.mark.parametrize(("declared", "status"), [(False, "info"), (True, "fail")])
def test_missing_rdma_rxe_fails_only_when_rxe_links_are_declared(
    tmp_path: Path, declared: bool, status: str
) -> None:
    gpu_node(tmp_path / "root")  # no rdma_rxe in its module tree
    config = tmp_path / "etc"
    config.mkdir()
    if declared:
        (config / "rdmad.toml").write_text('[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n')
    report = run_checks(Root(str(tmp_path / "root")), str(config))
    [check] = [c for c in report.checks if c.id == "rxe"]
    assert check.status == status
    assert ("[[rxe]] links are declared" in check.summary) is declared


def _digest(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            out[str(path)] = (st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def test_no_tools_in_path_only_stdlib_and_nothing_written(tmp_path: Path) -> None:
    """As a process with PATH=/nonexistent (no modprobe, modinfo, ip, rdma): it works,
    loads only the standard library and its own modules, and changes no file."""
    broken(tmp_path / "root")
    before = _digest(tmp_path)
    script = (
        "import sys, runpy\n"
        "sys.argv = ['rdmad-ctl'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('rdmad.ctl', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    mods = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('msgspec', 'structlog', 'pyudev', 'aiohttp') or m.startswith('rdmad.'))\n"
        "    sys.stderr.write(' '.join(mods))\n    raise\n"
    )
    env = {**ctl_env(), "PATH": "/nonexistent"}
    proc = subprocess.run(
        [sys.executable, "-c", script, "doctor", "--json", "--root", str(tmp_path / "root"),
         "--config", str(tmp_path / "etc")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["blocking"] is True
    loaded = set(proc.stderr.split())
    allowed = (
        "rdmad.ctl", "rdmad.doctor", "rdmad.peermem", "rdmad.modsupport", "rdmad.text",
        "rdmad.tomlfiles", "rdmad.tomlcompat",  # tomllib (tomli on Python 3.10)
        "rdmad.netnsnames", "rdmad.exits",
        "rdmad.openibd",  # openibd.service's stop, read as the daemon reads it
        "rdmad.managers",  # other managers' SR-IOV files, read as the daemon reads them
        "rdmad.pfselect",  # which PFs a selector matches, as the daemon decides it
        "rdmad.udevdb",  # whether udevd has processed a PF yet, as the daemon judges it
        "rdmad.pathkeys",  # what a path in the config must be (rdmad-ctl's config reading)
    )  # fmt: skip
    assert all(m.startswith(allowed) for m in loaded), loaded
    assert _digest(tmp_path) == before


def test_refused_reads_are_listed(tmp_path: Path) -> None:
    root = Root(str(tmp_path))
    root._note("proc/kallsyms", PermissionError(13, "Permission denied"))
    root._note("proc/nothing", FileNotFoundError(2, "No such file or directory"))
    assert root.refused == {"/proc/kallsyms": "Permission denied"}


def test_bad_root_is_a_usage_error(tmp_path: Path) -> None:
    r = ctl("doctor", "--root", str(tmp_path / "missing"))
    assert r.code == 2 and "not a directory" in r.err
    assert os.path.exists(tmp_path) and not (tmp_path / "missing").exists()


def _netns_check(tmp_path: Path, config: str | None) -> Check:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    if config is not None:
        (etc / "rdmad.toml").write_text(config)
    report = run_checks(Root(str(tmp_path / "root")), str(etc))
    return next(c for c in report.checks if c.id == "rdma-netns")


def test_rdma_netns_mode_as_declared_and_at_next_load(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    fs.write("sys/module/ib_core/parameters/netns_mode", "N")
    fs.write("etc/modprobe.d/rdmad-ib-core.conf", "options ib_core netns_mode=0\n")
    check = _netns_check(tmp_path, '[rdma]\nnetns_mode = "exclusive"\n')
    assert (check.status, check.summary) == ("ok", "RDMA netns mode exclusive")
    assert "at ib_core's next load: exclusive (/etc/modprobe.d/rdmad-ib-core.conf)" in (
        check.evidence
    )
    # Not managed: said, not judged.
    check = _netns_check(tmp_path, "")
    assert check.status == "info" and "not managed" in check.summary


def test_rdma_netns_mode_without_the_option_is_a_warning(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    fs.write("sys/module/ib_core/parameters/netns_mode", "N")
    check = _netns_check(tmp_path, '[rdma]\nnetns_mode = "exclusive"\n')
    assert check.status == "warn" and "next load gives shared" in check.summary


def test_rdma_netns_mode_blocked_names_the_namespaces(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    root = tmp_path / "root"
    fs.write("sys/module/ib_core/parameters/netns_mode", "Y")
    fs.write("proc/self/ns/net", "")
    fs.write("run/netns/blue", "")
    (root / "proc/200/ns").mkdir(parents=True)
    os.link(root / "run/netns/blue", root / "proc/200/ns/net")
    fs.write("proc/200/comm", "dnsmasq")
    check = _netns_check(tmp_path, '[rdma]\nnetns_mode = "exclusive"\n')
    assert check.status == "fail"
    assert "1 other network namespace(s) block the change" in check.summary
    assert "network namespace 'blue' (ip netns): pid 200 (dnsmasq)" in check.evidence


def test_autoprobe_seen_and_declared(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    fs.write(f"sys/bus/pci/devices/{CX}/sriov_drivers_autoprobe", "1\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/rdmad.toml").write_text(
        f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 8\nautoprobe = false\n'
    )

    def evidence() -> tuple[str, ...]:
        checks = run_checks(Root(str(tmp_path / "root")), str(tmp_path / "etc")).checks
        [sriov] = [c for c in checks if c.id == "sriov"]
        assert sriov.status == "ok"
        return sriov.evidence

    assert evidence() == (
        f"pf pci={CX} ({CX}, mlx5_core): up to 16 VFs, autoprobe 1 "
        "(declared 0: rdmad writes it at its next pass)",
    )
    fs.write(f"sys/bus/pci/devices/{CX}/sriov_drivers_autoprobe", "0\n")
    assert evidence() == (f"pf pci={CX} ({CX}, mlx5_core): up to 16 VFs, autoprobe 0",)


def test_on_this_host_devlink_adds_only_its_pure_codec(tmp_path: Path) -> None:
    """With --root / the doctor asks devlink (the eSwitch check), through the daemon's
    pure codec: still nothing from rdmad's dependencies or its kernel layer's sockets."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rdmad.toml").write_text(
        '[[sriov]]\npf = { pci = "0000:ff:1f.7" }\nnumvfs = 1\neswitch = { mode = "switchdev" }\n'
    )
    script = (
        "import sys, runpy\n"
        "sys.argv = ['rdmad-ctl'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('rdmad.ctl', run_name='__main__')\n"
        "except SystemExit:\n"
        "    sys.stderr.write(' '.join(sorted(m for m in sys.modules if m.startswith('rdmad.'))))\n"
        "    raise\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "doctor", "--json", "--root", "/", "--config", str(etc)],
        capture_output=True, text=True, env=ctl_env(), timeout=60, check=False,
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    [eswitch] = [c for c in doc["checks"] if c["check"] == "eswitch"]
    assert eswitch["status"] == "unknown", eswitch
    assert eswitch["evidence"] == ["pf pci=0000:ff:1f.7: not present"], eswitch
    kernel = {m for m in proc.stderr.split() if m.startswith("rdmad.kernel")}
    assert kernel == {
        "rdmad.kernel", "rdmad.kernel.netlink", "rdmad.kernel.netlink.devlink_codec",
        "rdmad.kernel.netlink.nlcodec",
    }  # fmt: skip


def test_openibd_says_whether_its_stop_asks_the_guard(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")

    def check() -> Check:
        checks = run_checks(Root(str(tmp_path / "root")), None).checks
        return next(c for c in checks if c.id == "openibd")

    assert not [c for c in run_checks(Root(str(fs.root)), None).checks if c.id == "openibd"]
    fs.write("lib/systemd/system/openibd.service", "[Service]\nExecStop=/etc/init.d/openibd stop")
    assert (check().status, check().summary) == (
        "info",
        "openibd.service: not guarded (no guard declared)",
    )
    fs.write(
        "etc/modprobe.d/rdmad-guard.conf", "remove igb [ -e /p ] || exec ...; exec /p remove igb"
    )
    assert check().status == "warn" and "drop-in is missing" in check().summary
    fs.write(
        "run/systemd/system/openibd.service.d/rdmad-guard.conf",
        "[Service]\nExecStop=\nExecStop=/bin/sh -c 'check'\nExecStop=/etc/init.d/openibd stop",
    )
    assert (check().status, check().summary) == (
        "ok",
        "openibd.service: its stop asks the guard first",
    )
    fs.write("lib/systemd/system/openibd.service", "[Service]\nExecStop=/opt/doca/stop")
    assert "does not run what the unit runs" in check().summary
    (fs.root / "etc/systemd/system/openibd.service.d").mkdir(parents=True)
    os.symlink("gone", fs.root / "etc/systemd/system/openibd.service.d/x.conf")
    assert check().status == "warn" and "cannot be known" in check().summary


def test_other_managers_of_a_declared_pf(tmp_path: Path) -> None:
    fs = healthy(tmp_path / "root")
    (tmp_path / "etc").mkdir()
    declared = f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 8\n'
    (tmp_path / "etc/rdmad.toml").write_text(declared)

    def check() -> Check:
        checks = run_checks(Root(str(tmp_path / "root")), str(tmp_path / "etc")).checks
        [found] = [c for c in checks if c.id == "other-managers"]
        return found

    assert (check().status, check().summary) == (
        "ok",
        "no other network manager declares SR-IOV for the 1 declared PF(s)",
    )
    fs.write(
        "etc/NetworkManager/system-connections/ib.nmconnection",
        "[connection]\nid=ib\ntype=infiniband\ninterface-name=ibp59s0\n[sriov]\ntotal-vfs=4\n",
    )
    held = check()
    assert (held.status, held.summary) == (
        "warn",
        "1 declared PF(s) held: rdmad writes nothing to them",
    )
    assert held.evidence == (
        f"pf pci={CX} ({CX}): NetworkManager declares SR-IOV for this PF in "
        "/etc/NetworkManager/system-connections/ib.nmconnection ([sriov] total-vfs=4)",
    )
    assert 'owner = "rdmad"' in held.suggestion
    (tmp_path / "etc/rdmad.toml").write_text(declared + 'owner = "rdmad"\n')
    taken = check()
    assert taken.status == "warn" and "taken over" in taken.summary
    # A directory the doctor cannot read (not root): unknown, never "nothing there".
    (tmp_path / "etc/rdmad.toml").write_text(declared)
    os.remove(tmp_path / "root/etc/NetworkManager/system-connections/ib.nmconnection")
    os.rmdir(tmp_path / "root/etc/NetworkManager/system-connections")
    (tmp_path / "root/etc/NetworkManager/system-connections").symlink_to("loop")
    (tmp_path / "root/etc/NetworkManager/loop").symlink_to("system-connections")
    unknown = check()
    assert unknown.status == "unknown"
    assert "cannot list /etc/NetworkManager/system-connections: " in unknown.evidence[0]
