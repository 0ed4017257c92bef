"""Every rdmad_* name the alert rules and the dashboard use is documented.

docs/METRICS.md's table is the contract; histogram series (`_bucket`, `_sum`,
`_count`) count as their documented base name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, METRICS_DOC

NAME = re.compile(r"\brdmad_[a-z0-9_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented() -> set[str]:
    rows = re.findall(r"^\| `(rdmad_[a-z0-9_]+)` \|", METRICS_DOC.read_text(), re.M)
    return set(rows)


def base(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def rule_exprs() -> list[str]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "rdmad-alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads((DEPLOY / "grafana" / "rdmad.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_metrics_doc_lists_names() -> None:
    # Guards the regex: a reformatted table must not make the check vacuous.
    assert {"rdmad_up", "rdmad_objects", "rdmad_vfs_desired"} <= documented()


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_names_are_documented(source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    used = {base(n) for e in exprs for n in NAME.findall(e)}
    assert used, f"no rdmad_ metric found in the {source}"
    assert used - documented() == set()


def test_dashboard_panels_have_queries() -> None:
    assert all(e.strip() for e in dashboard_exprs())
    assert Path(DEPLOY / "grafana" / "rdmad.json").stat().st_size > 0
