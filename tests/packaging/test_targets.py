"""One package per release and architecture (packaging/targets.toml): the matrix is
consistent with the spec and control file, the rpm's bundled() Provides follow the
lock's markers for each release's Python, and packages built for another Python and
another architecture than this machine's carry that Python's and that architecture's
wheels, depend on that interpreter, and compile their bytecode when installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.packaging.conftest import REPO, build, need

sys.path.insert(0, str(REPO / "packaging"))
import deb_depends
import targets

TARGETS = targets.load()
LOCK = REPO / "packaging/requirements.lock"


def _lock_requirements() -> list[Requirement]:
    """The lock's pins with their markers (continuation lines joined, hashes dropped)."""
    text = LOCK.read_text().replace("\\\n", " ")
    reqs = []
    for line in text.splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            reqs.append(Requirement(re.sub(r"\s--hash=\S+", "", line).strip()))
    return reqs


def bundled_for(python: str) -> set[str]:
    """What the lock installs for CPython ``python`` on Linux, by packaging's markers."""
    env = {"python_version": python, "python_full_version": f"{python}.0"}
    return {
        f"bundled(python3dist({canonicalize_name(r.name)})) = {next(iter(r.specifier)).version}"
        for r in _lock_requirements()
        if r.marker is None or r.marker.evaluate(env)
    }


def test_every_target_is_complete_and_the_spec_defaults_are_el9() -> None:
    assert {t["format"] for t in TARGETS.values()} == {"deb", "rpm"}
    for name, t in TARGETS.items():
        assert re.fullmatch(r"3\.1[0-3]", t["python"]), name
        assert t["interpreter"] == f"/usr/bin/python{t['python']}", name
        assert re.fullmatch(r"2\.\d+", t["glibc"]), name
    spec = (REPO / "packaging/rpm/rdmad.spec").read_text()
    el9 = TARGETS["el9"]
    assert "%{!?rdmad_target: %global rdmad_target el9}" in spec
    assert f"%{{!?rdmad_python: %global rdmad_python {el9['python']}}}" in spec
    assert f"%{{!?rdmad_requires: %global rdmad_requires {el9['requires']}}}" in spec
    assert "ExclusiveArch:  x86_64 aarch64" in spec
    control = (REPO / "packaging/deb/debian/control").read_text()
    assert "Architecture: amd64 arm64" in control


def test_the_lock_covers_every_target_python() -> None:
    """Each release's Python gets exactly one pin of every package it needs."""
    for python in sorted({t["python"] for t in TARGETS.values()}):
        names = [p.split("(")[2].split(")")[0] for p in bundled_for(python)]
        assert len(names) == len(set(names)), (python, names)
        assert {"aiohttp", "msgspec", "multidict", "structlog"} <= set(names)
        assert ("tomli" in names) == (python == "3.10"), python


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_spec_declares_what_the_lock_bundles_for_each_python(python: str) -> None:
    """The spec's Lua reads the lock's markers as the packaging library does."""
    need("rpmspec")
    proc = subprocess.run(
        [
            "rpmspec", "-q", "--provides",
            "--define", f"rdmad_python {python}",
            "--define", f"_sourcedir {REPO / 'packaging'}",
            str(REPO / "packaging/rpm/rdmad.spec"),
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    declared = {ln for ln in proc.stdout.splitlines() if ln.startswith("bundled(")}
    assert declared == bundled_for(python)


def test_glibc_floor_is_the_newest_manylinux_level_of_the_wheels(tmp_path: Path) -> None:
    for name, tags in {
        "a": ["cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux2014_x86_64"],
        "b": ["cp311-cp311-manylinux_2_28_x86_64"],
        "c": ["py3-none-any"],
    }.items():
        info = tmp_path / f"{name}-1.dist-info"
        info.mkdir()
        (info / "WHEEL").write_text("".join(f"Tag: {t}\n" for t in tags))
    assert deb_depends.glibc_floor(tmp_path) == (2, 28)
    assert deb_depends.glibc_floor(tmp_path / "none") is None


# --- packages built for another Python and architecture --------------------------------


@pytest.fixture(scope="module")
def deb13_arm64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Debian 13 (Python 3.13, not on this machine) for arm64 (not this machine's)."""
    need("dpkg-buildpackage", "dh", "dpkg-deb")
    deb = build("build-deb.sh", "--target", "debian13", "--arch", "arm64")
    root = tmp_path_factory.mktemp("deb13-arm64")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return deb, root


def test_foreign_deb_has_the_releases_python_and_arch(deb13_arm64: tuple[Path, Path]) -> None:
    deb, root = deb13_arm64
    assert re.search(r"rdmad_0\.1\.0-1~deb13_arm64\.deb$", deb.name)
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Architecture", "Depends"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "Architecture: arm64" in fields
    assert re.search(r"\bpython3\.13\b", fields) and re.search(r"libc6 \(>= 2\.\d+\)", fields)
    venv = root / "usr/lib/rdmad"
    # The release's interpreter (dh_link makes the link relative, as Debian policy asks).
    link = (venv / "bin/python3").readlink()
    assert os.path.normpath(Path("/usr/lib/rdmad/bin") / link) == "/usr/bin/python3.13"
    site = venv / "lib/python3.13/site-packages"
    sos = list(site.rglob("*.so"))
    assert sos and all("cpython-313-aarch64-linux-gnu" in s.name for s in sos)
    for so in sos:  # ELF e_machine 183: AArch64
        assert int.from_bytes(so.read_bytes()[18:20], "little") == 183, so
    # No Python 3.13 here: no bytecode shipped, postinst compiles it.
    assert (venv / "COMPILE_AT_INSTALL").read_text().strip() == "3.13"
    assert not list(venv.rglob("*.pyc"))
    dists = {p.name.split("-")[0].lower().replace("_", "-") for p in site.glob("*.dist-info")}
    expected = {b.split("(")[2].split(")")[0] for b in bundled_for("3.13")} | {"rdmad"}
    assert dists == expected


def test_foreign_deb_compiles_at_install_and_cleans_on_remove(
    deb13_arm64: tuple[Path, Path], tmp_path: Path
) -> None:
    deb, _ = deb13_arm64
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    postinst = (control / "postinst").read_text()
    prerm = (control / "prerm").read_text()
    compile_at = postinst.index("COMPILE_AT_INSTALL")
    assert "compileall" in postinst and compile_at < postinst.index("deb-systemd-invoke")
    assert "__pycache__" in prerm and prerm.index("deb-systemd-invoke stop") < prerm.index(
        "__pycache__"
    )


@pytest.fixture(scope="module")
def el10_aarch64() -> Path:
    need("rpmbuild", "rpm")
    return build("build-rpm.sh", "--target", "el10", "--arch", "aarch64")


def test_foreign_rpm_requires_its_python_and_declares_what_it_bundles(el10_aarch64: Path) -> None:
    rpm = el10_aarch64
    assert rpm.name.endswith(".el10.aarch64.rpm")

    def q(*args: str) -> list[str]:
        out = subprocess.run(
            ["rpm", "-qp", *args, str(rpm)], capture_output=True, text=True, check=True
        ).stdout
        return out.splitlines()

    assert "/usr/bin/python3.12" in q("--requires")
    files = q("-l")
    site = "/usr/lib/rdmad/lib/python3.12/site-packages/"
    dists = {
        f[len(site) :].split("-")[0].lower().replace("_", "-")
        for f in files
        if f.startswith(site) and f.endswith(".dist-info")
    }
    provides = {p for p in q("--provides") if p.startswith("bundled(")}
    assert provides == bundled_for("3.12")
    assert {p.split("(")[2].split(")")[0] for p in provides} | {"rdmad"} == dists
    assert "/usr/lib/rdmad/COMPILE_AT_INSTALL" in files
