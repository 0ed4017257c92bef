"""Fixtures for the host-side package checks: the .deb and .rpm built from this tree.

Each is built once per session by scripts/build-deb.sh / build-rpm.sh, which cache
by a hash of their inputs (a warm cache answers in a second). Where the build tools
are missing the checks skip and say how to get them; in CI (CI=true) or with
RDMAD_PACKAGING_REQUIRED=1 they fail instead, so a missing tool cannot pass as green.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HINT = "run scripts/pkg-deps.sh as root"


def need(*tools: str) -> None:
    """Skip (fail where the packages are required) unless every tool is on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    why = f"{', '.join(missing)} not found ({HINT})"
    if os.environ.get("CI", "").lower() == "true" or os.environ.get("RDMAD_PACKAGING_REQUIRED"):
        pytest.fail(f"packages are required here but {why}", pytrace=False)
    pytest.skip(why)


def build(script: str, *args: str) -> Path:
    """The package scripts/SCRIPT ARGS builds (cached by its inputs): its path."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def deb() -> Path:
    need("dpkg-buildpackage", "dh", "dpkg-deb")
    return build("build-deb.sh")


@pytest.fixture(scope="session")
def rpm() -> Path:
    need("rpmbuild", "rpm")
    return build("build-rpm.sh")


@pytest.fixture(scope="session")
def deb_tree(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The .deb's files, unpacked (no maintainer scripts run)."""
    root = tmp_path_factory.mktemp("deb-root")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


@pytest.fixture(scope="session")
def deb_control(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The .deb's control area: control, conffiles, maintainer scripts."""
    control = tmp_path_factory.mktemp("deb-control")
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    return control
