"""The completions the packages install, read from the packaging files (no package is
built here): every file of completion/ goes where its shell looks for it, on each family
of distributions (zsh: vendor-completions on Debian and Ubuntu, site-functions on the
RHEL family)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.packaging.conftest import REPO

RULES = REPO / "packaging" / "deb" / "debian" / "rules"
SPEC = REPO / "packaging" / "rpm" / "rdmad.spec"
ZSH = {"deb": "/usr/share/zsh/vendor-completions", "rpm": "/usr/share/zsh/site-functions"}


def wanted(family: str) -> dict[str, str]:
    """completion/NAME -> where the shell that reads it looks, for each file there."""
    out = {}
    for path in sorted((REPO / "completion").iterdir()):
        name = path.name
        if name.endswith(".bash"):
            out[name] = f"/usr/share/bash-completion/completions/{name.removesuffix('.bash')}"
        elif name.endswith(".fish"):
            out[name] = f"/usr/share/fish/vendor_completions.d/{name}"
        else:
            assert name.startswith("_"), name
            out[name] = f"{ZSH[family]}/{name}"
    return out


def installed(text: str, root: str) -> dict[str, str]:
    found = re.findall(rf"install -D -m 0644 completion/(\S+) {re.escape(root)}(\S+)", text)
    return dict(found)


def test_both_programs_in_three_shells_are_in_the_tree() -> None:
    names = set(wanted("deb"))
    for prog in ("rdmad", "rdmad-ctl"):
        assert {f"{prog}.bash", f"_{prog}", f"{prog}.fish"} <= names


def test_the_deb_installs_each_where_its_shell_looks() -> None:
    assert installed(RULES.read_text(), "$(PKG)") == wanted("deb")


def test_the_rpm_installs_and_owns_each_where_its_shell_looks() -> None:
    spec = SPEC.read_text()
    assert installed(spec, "%{buildroot}") == wanted("rpm")
    files = spec.split("\n%files", 1)[1]
    for dest in wanted("rpm").values():
        assert re.search(rf"^{re.escape(dest)}$", files, re.M), f"%files lacks {dest}"


def test_the_deb_and_rpm_content_checks_follow_this_list() -> None:
    """The tests that build the packages look for the same paths."""
    for test in ("test_deb.py", "test_rpm.py"):
        assert "wanted(" in (Path(__file__).parent / test).read_text(), test
