"""`rdmad-ctl status`'s words for the peermem object, from the facts the daemon reads to
the table: each state said as what is there, never a "no module" joined to a "not
loaded" (a GPU node with no peer-memory module for its kernel showed "no module not
loaded")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmad.api import documents as docs
from rdmad.ctl.render.status import NO_MODULE_NAME, status_lines
from rdmad.doctor import Root
from rdmad.model import ModulesObserved, Observed, PlanState
from rdmad.model.desired import Desired
from rdmad.model.validation import validate
from rdmad.peermem.facts import gather
from rdmad.peermem.names import CANDIDATES, modprobe_name
from rdmad.reconcile import plan
from rdmad.reconcile.detail import describe
from rdmad.status import ObjectReport, StatusSnapshot
from tests.ctl.conftest import NOW
from tests.support.fakesysfs import PEERMEM_KO, SIGNED, gpu_node

BUILTIN_RDMA = ("ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib")


def status_text(root: Path, mode: str = "auto") -> tuple[str, dict[str, object]]:
    """The status table and the peermem object's `observed`, as the daemon would make
    them from the tree at ``root`` (the same gather, plan and detail)."""
    facts = gather(Root(str(root)), full=True)
    observed = Observed(
        modules=ModulesObserved(
            facts.loaded,
            support="disabled" if facts.loading_disabled else "loadable",
            peermem=facts,
        )
    )
    desired = validate(Desired, {"peermem": {"mode": mode}})
    actions = plan(desired, observed, PlanState())
    detail = describe(desired, observed, actions)["peermem"]
    [attr] = detail.attributes
    snap = StatusSnapshot(
        objects=(ObjectReport("peermem", attr.state, attr.reason, detail=detail),),
        passes=1,
        ready=True,
    )
    doc = json.loads(docs.dumps(docs.status_doc(snap, docs.DaemonFacts(812, NOW - 60))))
    return "\n".join(status_lines(doc, NOW, verbose=True)), doc["objects"][0]["observed"]


def test_the_module_named_when_none_is_installed_is_the_one_the_daemon_names() -> None:
    assert modprobe_name(CANDIDATES[0]) == NO_MODULE_NAME


def test_no_module_for_the_kernel_with_loading_disabled(tmp_path: Path) -> None:
    """The node of the report: the open GPU driver loaded, ib_core and mlx5 built in,
    module loading disabled, no nvidia-peermem for the running kernel."""
    fs = gpu_node(
        tmp_path, loaded=("nvidia",), builtin=BUILTIN_RDMA, installed={}, nvidia_taint="O"
    )
    fs.write("proc/sys/kernel/modules_disabled", "1")
    text, observed = status_text(tmp_path)
    assert observed["module"] is None and observed["loaded"] is False
    assert "no nvidia-peermem module for this kernel" in text
    assert "no module not loaded" not in text and " not loaded" not in text.split("REASON")[1]


@pytest.mark.parametrize(
    ("loaded", "installed", "words"),
    [
        (("nvidia", "ib_core"), {}, "no nvidia-peermem module for this kernel"),
        (("nvidia", "ib_core"), None, "nvidia-peermem not loaded"),
        (("nvidia", "ib_core", "nvidia_peermem"), None, "nvidia-peermem loaded"),
        (("ib_core",), {}, "no GPU driver"),
        (("nvidia",), {}, "no ib_core"),
    ],
    ids=["missing", "installed", "loaded", "no-gpu", "no-ib-core"],
)
def test_observed_words(
    tmp_path: Path,
    loaded: tuple[str, ...],
    installed: dict[str, bytes] | None,
    words: str,
) -> None:
    installed = (
        {PEERMEM_KO: b"ib_register_peer_memory_client" + SIGNED} if installed is None else installed
    )
    gpu_node(tmp_path, loaded=loaded, installed=installed)
    text, _ = status_text(tmp_path, "require")  # listed whatever the facts ("auto" is not)
    [row] = [line for line in text.splitlines() if line.split()[1:2] == ["peermem"]]
    assert words in row, text
    assert f"peermem: {text.split('peermem: ')[1].split(' (')[0]} ({words}" in text
    assert "no module" not in text
