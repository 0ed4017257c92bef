"""The documents the packages install under /usr/share/doc/rdmad, read from the packaging
files themselves (no package is built here): the .deb and the .rpm ship the same ones,
the installed README is the node's (docs/README.md), and every link in a shipped
document leads to a shipped file, on the node as in the source tree."""

from __future__ import annotations

import re
from pathlib import Path

from tests.packaging.conftest import REPO

DOC = "usr/share/doc/rdmad"
DEBIAN = REPO / "packaging" / "deb" / "debian"
SPEC = REPO / "packaging" / "rpm" / "rdmad.spec"


def deb_docs() -> dict[str, Path]:
    """Path under /usr/share/doc/rdmad -> its source: debian/rdmad.docs (dh_installdocs
    installs each by its base name) and the rules' own installs there."""
    out = {Path(ln).name: REPO / ln for ln in (DEBIAN / "rdmad.docs").read_text().split()}
    rules = (DEBIAN / "rules").read_text().replace("\\\n", " ")
    for src, dest in re.findall(rf"install -D -m 0644 (\S+) \$\(PKG\)/{DOC}/(\S+)", rules):
        out[dest] = REPO / src
    return out


def rpm_docs() -> dict[str, Path]:
    spec = SPEC.read_text()
    out: dict[str, Path] = {}
    for src, dest in re.findall(rf"install -D -m 0644 (\S+) %{{buildroot}}/{DOC}/(\S+)", spec):
        if "$doc" in src:
            loop = re.search(r"^for doc in (.*); do\n\s+install .*\$doc", spec, re.M)
            assert loop, "the spec's loop over docs/ is not where it was"
            for name in loop.group(1).split():
                out[dest.replace("$doc", name)] = REPO / src.replace("$doc", name)
        else:
            out[dest] = REPO / src
    return out


def links(text: str) -> list[str]:
    """The targets of a Markdown text's inline links, code spans left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def anchors(text: str) -> set[str]:
    """The anchors a Markdown page's headings make (as GitHub and most viewers do)."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_deb_and_rpm_ship_the_same_documents() -> None:
    deb, rpm = deb_docs(), rpm_docs()
    assert deb == rpm
    for dest, src in deb.items():
        assert src.is_file(), f"{dest}: its source {src} is not in the tree"


def test_the_installed_readme_is_the_nodes() -> None:
    src = deb_docs()["README.md"]
    assert src == REPO / "docs" / "README.md"
    text = src.read_text()
    first = text.split("\n\n", 2)[1]  # the paragraph under the title
    assert "clone" not in text and "scripts/" not in text, "a developer's README"
    assert "rdmad keeps this node's RDMA setup" in first
    # The unit's Documentation= names it.
    assert f"file:///{DOC}/README.md" in (REPO / "systemd" / "rdmad.service").read_text()


def test_every_link_in_a_shipped_document_resolves_on_the_node_and_in_the_tree() -> None:
    shipped = deb_docs()
    checked = 0
    for dest, src in shipped.items():
        if src.suffix != ".md":
            continue
        for target in links(src.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a URL (none is needed to read the docs on a node)
            path, _, anchor = target.partition("#")
            on_node = str(Path(dest).parent / path) if path else dest
            on_node = str(Path(on_node))  # ./X, X/ -> X
            assert on_node in shipped, f"{dest} links {target}: not shipped"
            in_tree = (src.parent / path) if path else src
            assert in_tree.exists(), f"{src.relative_to(REPO)} links {target}: not in the tree"
            if anchor and on_node.endswith(".md"):
                heads = anchors(shipped[on_node].read_text())
                assert anchor in heads, f"{dest} links {target}: no such heading"
            checked += 1
    assert checked > 20


def test_the_readme_links_the_planner_fleet_and_log_documents() -> None:
    targets = {t.partition("#")[0] for t in links((REPO / "docs" / "README.md").read_text())}
    assert {"PLANNER.md", "FLEET.md", "LOGS.md", "CONFIG-REFERENCE.md", "GUARD.md"} <= targets


def test_every_document_the_code_names_is_shipped() -> None:
    """--help, error answers and the man pages name files under /usr/share/doc/rdmad."""
    shipped = deb_docs()
    named = set()
    for path in (REPO / "rdmad").rglob("*.py"):
        text = re.sub(r"\\+-", "-", path.read_text())  # troff's hyphen in the man pages
        found = re.findall(rf"/{DOC}/([\w.-]+(?:/[\w.-]+)*)", text)
        named |= {name.rstrip(".") for name in found}
    assert {"API.md", "README.md"} <= named
    assert named <= set(shipped), f"named but not shipped: {sorted(named - set(shipped))}"
