"""packaging/requirements.lock pins every runtime dependency of pyproject.toml, hashed."""

from __future__ import annotations

import re

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.packaging.conftest import REPO


def _pins(path: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes file."""
    text = (REPO / path).read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)\s*(.*)$", line)
        if match:
            name, version, rest = match.groups()
            pins[canonicalize_name(name)] = (version, re.findall(r"--hash=sha256:\w{64}", rest))
    return pins


def test_runtime_lock_satisfies_pyproject_with_hashes() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        deps = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    pins = _pins("packaging/requirements.lock")
    for dep in deps:
        name = canonicalize_name(dep.name)
        assert name in pins, f"{dep.name} is not in the lock: run `make lock`"
        version, _ = pins[name]
        assert dep.specifier.contains(version), f"{dep.name}=={version} violates {dep}"
    assert all(hashes for _, hashes in pins.values()), "every pin needs its hashes"


def test_build_lock_pins_the_build_backend() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        requires = [Requirement(r) for r in tomllib.load(f)["build-system"]["requires"]]
    pins = _pins("packaging/build-requirements.lock")
    for req in requires:
        version, hashes = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(version) and hashes


def test_docs_lock_pins_the_man_page_tool_of_the_dev_extra() -> None:
    """The package build makes its man pages with the argparse-manpage the tests use."""
    with (REPO / "pyproject.toml").open("rb") as f:
        dev = [Requirement(r) for r in tomllib.load(f)["project"]["optional-dependencies"]["dev"]]
    (tool,) = [r for r in dev if r.name == "argparse-manpage"]
    pins = _pins("packaging/docs-requirements.lock")
    version, hashes = pins["argparse-manpage"]
    assert tool.specifier.contains(version) and hashes
