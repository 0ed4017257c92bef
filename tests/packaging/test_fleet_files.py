"""The fleet's files the packages install under /usr/share/rdmad, read from the packaging
files (no package is built here): the Prometheus alerting rules and the Grafana
dashboard of deploy/, at the same paths in the .deb and the .rpm, each directory holding
only what its consumer loads, and the documents naming the paths the packages use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.packaging.conftest import REPO

RULES = REPO / "packaging" / "deb" / "debian" / "rules"
SPEC = REPO / "packaging" / "rpm" / "rdmad.spec"
SHARE = "/usr/share/rdmad"
# In the source only: promtool's unit tests of the rules. Beside the rules on a node
# they would break `rule_files: [/usr/share/rdmad/prometheus/*.yml]` (not a rule file).
SOURCE_ONLY = {"deploy/prometheus/rules_test.yml"}


def wanted() -> dict[str, str]:
    """deploy/... -> its path on a node, for every file of deploy/prometheus and
    deploy/grafana that is not SOURCE_ONLY."""
    out = {}
    for tool in ("prometheus", "grafana"):
        for path in sorted((REPO / "deploy" / tool).iterdir()):
            src = path.relative_to(REPO).as_posix()
            if src not in SOURCE_ONLY:
                out[src] = f"{SHARE}/{tool}/{path.name}"
    return out


def installed(text: str, root: str) -> dict[str, str]:
    found = re.findall(rf"install -D -m 0644 (deploy/\S+) {re.escape(root)}(\S+)", text)
    return dict(found)


def test_the_rules_and_the_dashboard_are_what_ships() -> None:
    assert wanted() == {
        "deploy/prometheus/rdmad-alerts.yml": f"{SHARE}/prometheus/rdmad-alerts.yml",
        "deploy/grafana/rdmad.json": f"{SHARE}/grafana/rdmad.json",
    }
    for src in SOURCE_ONLY:
        assert (REPO / src).is_file(), src


def test_the_deb_installs_each() -> None:
    assert installed(RULES.read_text(), "$(PKG)") == wanted()


def test_the_rpm_installs_and_owns_each() -> None:
    spec = SPEC.read_text()
    assert installed(spec, "%{buildroot}") == wanted()
    files = spec.split("\n%files", 1)[1]
    assert re.search(rf"^{re.escape(SHARE)}/$", files, re.M), f"%files does not own {SHARE}/"


def test_each_shipped_rules_file_is_only_rules() -> None:
    """Prometheus refuses a rule file with any other top-level key: the directory can be
    loaded whole with a glob."""
    for src, dest in wanted().items():
        if "/prometheus/" in dest:
            doc = yaml.safe_load((REPO / src).read_text())
            assert set(doc) == {"groups"} and doc["groups"], src
    # What stays in the source is not a rule file: shipped beside them, the glob would fail.
    for src in SOURCE_ONLY:
        assert "groups" not in yaml.safe_load((REPO / src).read_text()), src


def test_the_dashboard_needs_no_import_inputs() -> None:
    """Provisioned from a file, a dashboard gets no import dialog: one that asks for
    `__inputs` (an exported dashboard's DS_PROMETHEUS) would load with no data source.
    This one picks its data source with a template variable instead."""
    doc = json.loads((REPO / "deploy/grafana/rdmad.json").read_text())
    assert "__inputs" not in doc
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "${DS_" not in (REPO / "deploy/grafana/rdmad.json").read_text()


def test_the_documents_name_the_installed_paths() -> None:
    """Where operators look for them: METRICS.md says how to load them, the node's README
    and the packaging README list them."""
    for doc in ("docs/METRICS.md", "docs/README.md", "packaging/README.md"):
        text = (REPO / doc).read_text()
        for dest in wanted().values():
            assert dest in text, f"{doc} does not name {dest}"


def test_the_deb_and_rpm_content_checks_follow_this_list() -> None:
    """The tests that build the packages compare these files with the tree's."""
    for test in ("test_deb.py", "test_rpm.py"):
        assert "fleet_files(" in (Path(__file__).parent / test).read_text(), test
