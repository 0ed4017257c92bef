"""The .rpm: file list, config flags, requirements, rpmlint, and its scriptlets run
against stub systemctl / systemd-sysusers for install, upgrade and erase."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO, need
from tests.packaging.test_completions import wanted
from tests.packaging.test_docs import DOC, rpm_docs
from tests.packaging.test_fleet_files import wanted as fleet_files
from tests.packaging.test_targets import TARGETS, bundled_for


def _rpm_q(rpm: Path, *args: str) -> str:
    return subprocess.run(
        ["rpm", "-qp", *args, str(rpm)], capture_output=True, text=True, check=True
    ).stdout


def _rpm_file(rpm: Path, path: str) -> bytes:
    """One file of the package's payload, as it installs."""
    return subprocess.run(
        f"rpm2cpio {rpm} | cpio -i --quiet --to-stdout .{path}",
        shell=True,
        capture_output=True,
        check=True,
    ).stdout


def test_rpm_files(rpm: Path) -> None:
    files = set(_rpm_q(rpm, "-l").split())
    for path in (
        "/usr/bin/rdmad",
        "/usr/bin/rdmad-ctl",
        "/usr/lib/rdmad/pyvenv.cfg",
        "/usr/lib/rdmad/bin/python3",
        "/usr/lib/rdmad/lib/python3.11/site-packages/rdmad/__init__.py",
        "/usr/lib/systemd/system/rdmad.service",
        "/usr/lib/systemd/system/rdmad-wait-converged.service",
        "/usr/lib/sysusers.d/rdmad.conf",
        "/usr/share/rdmad/metrics-tcp.conf",
        "/etc/rdmad",
        "/etc/rdmad/rdmad.d",
        "/etc/rdmad/rdmad.toml",
        "/usr/share/doc/rdmad/examples/rdmad.toml",
        *(f"/{DOC}/{dest}" for dest in rpm_docs()),
        "/usr/share/licenses/rdmad/LICENSE",
        "/usr/lib/systemd/system-preset/50-rdmad.preset",
    ):
        assert path in files, path
    # The man pages, compressed by rpmbuild (whichever compressor it uses).
    for page in ("man8/rdmad.8", "man8/rdmad-ctl.8", "man5/rdmad.toml.5"):
        assert [f for f in files if f.startswith(f"/usr/share/man/{page}")], page
    assert not [f for f in files if re.search(r"/(pip|setuptools)(-[^/]*)?/", f)]
    for dest in wanted("rpm").values():
        assert dest in files, dest
    assert not [f for f in files if "openibd.service.d" in f]  # written by rdmad, not shipped
    assert "/usr/share/rdmad/prometheus/rules_test.yml" not in files
    # Same unit, Prometheus rules and Grafana dashboard as the source tree, byte for byte.
    shipped = {"systemd/rdmad.service": "/usr/lib/systemd/system/rdmad.service", **fleet_files()}
    for src, dest in shipped.items():
        assert dest in files, dest
        assert _rpm_file(rpm, dest) == (REPO / src).read_bytes(), dest


def test_rpm_config_is_noreplace_and_venv_symlink_absolute(rpm: Path) -> None:
    flags = dict(
        line.rsplit(" ", 1)
        for line in _rpm_q(rpm, "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]").splitlines()
    )
    assert flags["/etc/rdmad/rdmad.toml"] == "cn"  # %config(noreplace)
    links = dict(
        line.split(" -> ")
        for line in _rpm_q(rpm, "--qf", "[%{FILENAMES} -> %{FILELINKTOS}\n]").splitlines()
    )
    assert links["/usr/lib/rdmad/bin/python3"] == "/usr/bin/python3.11"


def test_rpm_requires_the_interpreter_and_tools_only(rpm: Path) -> None:
    requires = {ln.split(" ")[0] for ln in _rpm_q(rpm, "--requires").splitlines()}
    assert {"python3.11", "systemd", "kmod"} <= requires
    # Nothing from inside the venv leaks into the dependency list.
    assert not [r for r in requires if r.startswith(("python3dist", "python(", "/usr/bin/python"))]
    provides = {ln.split(" ")[0] for ln in _rpm_q(rpm, "--provides").splitlines()}
    own = {"rdmad", "rdmad(x86-64)", "config(rdmad)"}
    assert own <= provides
    assert {p for p in provides - own if not p.startswith("bundled(python3dist(")} == set()


def test_rpm_declares_each_bundled_library_at_its_locked_version(rpm: Path) -> None:
    """One `Provides: bundled(python3dist(NAME)) = VERSION` per pin of the runtime lock that
    holds for the el9 build's Python (the lock is universal: its markers decide)."""
    provides = {p for p in _rpm_q(rpm, "--provides").splitlines() if p.startswith("bundled(")}
    assert provides == bundled_for(TARGETS["el9"]["python"])


def _scriptlets(rpm: Path) -> dict[str, str]:
    out = _rpm_q(rpm, "--scripts")
    parts = re.split(r"^(\w+) scriptlet \(using /bin/sh\):\n", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """systemctl and systemd-sysusers that record their argv (and stdin) in calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("systemctl", "systemd-sysusers"):
        stub = bin_dir / tool
        stub.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >>"{tmp_path}/calls.log"\n'
            f'[ "{tool}" = systemd-sysusers ] && sed "s/^/  stdin: /" >>"{tmp_path}/calls.log"\n'
            "exit 0\n"
        )
        stub.chmod(0o755)
    (tmp_path / "run-systemd-system").mkdir()
    return bin_dir


def _run(script: str, arg: int, stub_bin: Path) -> list[str]:
    """Run a scriptlet as rpm does (sh, $1 = package count) on a host "booted with systemd"."""
    root = stub_bin.parent
    log = root / "calls.log"
    log.unlink(missing_ok=True)
    text = script.replace("/run/systemd/system", str(root / "run-systemd-system"))
    env = {**os.environ, "PATH": f"{stub_bin}:/usr/bin:/bin"}
    proc = subprocess.run(
        ["sh", "-e", "-c", text, "scriptlet", str(arg)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_rpm_scriptlets_install_upgrade_erase(rpm: Path, stub_bin: Path) -> None:
    s = _scriptlets(rpm)
    assert set(s) == {"preinstall", "postinstall", "preuninstall", "postuninstall"}

    # %pre: the rdmad group, from the same line the sysusers.d file holds.
    assert _run(s["preinstall"], 1, stub_bin) == [
        "systemd-sysusers --replace=/usr/lib/sysusers.d/rdmad.conf -",
        "  stdin: g rdmad - -",
    ]
    # systemd's macros (here packaging/rpm/macros.systemd-fallback: no systemd-rpm-macros
    # on this machine). Install ($1 = 1): enabled through the preset, not started.
    # Upgrade ($1 = 2): the old package's %postun restarts it; %post does nothing.
    assert _run(s["postinstall"], 1, stub_bin) == [
        "systemctl daemon-reload",
        "systemctl --no-reload preset rdmad.service",
    ]
    assert _run(s["postinstall"], 2, stub_bin) == []
    assert _run(s["postuninstall"], 1, stub_bin) == [
        "systemctl daemon-reload",
        "systemctl try-restart rdmad.service",
    ]
    # Erase ($1 = 0): stopped and disabled first, then units reloaded; no restart.
    assert _run(s["preuninstall"], 0, stub_bin) == [
        "systemctl --no-reload disable --now rdmad.service"
    ]
    assert _run(s["preuninstall"], 1, stub_bin) == []
    assert _run(s["postuninstall"], 0, stub_bin) == ["systemctl daemon-reload"]


def test_rpm_preset_enables_the_service() -> None:
    lines = (REPO / "packaging/rpm/50-rdmad.preset").read_text().splitlines()
    assert [ln for ln in lines if ln and not ln.startswith("#")] == ["enable rdmad.service"]


def test_rpm_sysusers_line_matches_the_deb(rpm: Path) -> None:
    shipped = (REPO / "packaging/deb/debian/rdmad.sysusers").read_text()
    assert "g rdmad - -" in [ln.strip() for ln in shipped.splitlines()]


def test_rpmlint_clean_with_reasoned_filters(rpm: Path) -> None:
    need("rpmlint")
    proc = subprocess.run(
        [
            "rpmlint",
            *("-c", str(REPO / "packaging/rpm/rpmlint.toml")),
            *("-r", str(REPO / "packaging/rpm/rdmad.rpmlintrc")),
            str(rpm),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "0 errors, 0 warnings" in proc.stdout, proc.stdout + proc.stderr
