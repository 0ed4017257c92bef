"""The README's Layout section names every module and package under rdmad/, and names
nothing that is not there: a newcomer finds where a behaviour lives from it, so it must
follow the tree when modules move or split."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def tree() -> tuple[set[str], set[str]]:
    """Module file names and package directory names under rdmad/."""
    modules, packages = set(), set()
    for path in (ROOT / "rdmad").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            modules.add(path.name)
        if path.name == "__init__.py" and path.parent != ROOT / "rdmad":
            packages.add(path.parent.name)
    return modules, packages


def test_every_module_and_package_is_named() -> None:
    block = layout_block()
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.py\b", block))
    named_dirs = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)/", block))
    modules, packages = tree()
    assert not modules - named, f"modules missing from README's Layout: {sorted(modules - named)}"
    assert not packages - named_dirs, (
        f"packages missing from Layout: {sorted(packages - named_dirs)}"
    )


def test_nothing_named_that_is_not_there() -> None:
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.py\b", layout_block()))
    modules, _ = tree()
    tests_and_bench = {p.name for d in ("tests", "bench") for p in (ROOT / d).rglob("*.py")}
    gone = named - modules - tests_and_bench
    assert not gone, f"README's Layout names modules that do not exist: {sorted(gone)}"
