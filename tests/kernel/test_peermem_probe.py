"""observe() carries the peer-memory facts; the probe reads the module tree only where
the declared mode's decision can turn on it (a GPU driver loaded; for auto the RDMA core
too), and again only when what it depends on changed. Nothing declared that can load a
module: neither the module tree nor /proc/kallsyms is read."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.apply.observe import observe
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Desired, LoadModule, ObserveScope, PeermemSpec, PlanState
from rdmad.model.validation import validate
from rdmad.reconcile import observe_scope, plan
from tests.support.countingsysfs import CountingSysfs
from tests.support.fakesysfs import RELEASE, gpu_node


def test_observe_plans_peermem_on_a_fake_gpu_node(tmp_path: Path) -> None:
    gpu_node(tmp_path)
    seen = observe(Sysfs(tmp_path))
    assert seen.modules.peermem.module() is not None
    assert seen.modules.peermem.release == RELEASE
    assert plan(Desired(), seen, PlanState()) == []  # not declared: left alone
    auto = Desired(peermem=PeermemSpec(mode="auto"))
    [load] = plan(auto, seen, PlanState())
    assert isinstance(load, LoadModule) and load.module == "nvidia-peermem"


def test_no_gpu_driver_no_module_tree_read(tmp_path: Path) -> None:
    gpu_node(tmp_path, loaded=("ib_core", "mlx5_ib"))
    facts = PeermemProbe().facts(Sysfs(tmp_path))
    assert not facts.probed and facts.files == ()
    auto = Desired(peermem=PeermemSpec(mode="auto"))
    assert plan(auto, observe(Sysfs(tmp_path)), PlanState()) == []


def test_probe_reads_again_when_modules_dep_is_rewritten(tmp_path: Path) -> None:
    fs = gpu_node(tmp_path, installed={})
    probe = PeermemProbe()
    assert probe.facts(Sysfs(tmp_path)).files == ()
    # DKMS builds the module and depmod rewrites modules.dep: no module event says so.
    ko = tmp_path / f"lib/modules/{RELEASE}/updates/dkms/nvidia-peermem.ko"
    ko.parent.mkdir(parents=True)
    ko.write_bytes(b"module")
    fs.write(
        f"lib/modules/{RELEASE}/modules.dep",
        "updates/dkms/nvidia-peermem.ko: kernel/drivers/infiniband/core/ib_core.ko\n"
        "kernel/drivers/infiniband/core/ib_core.ko:",
    )
    assert [m.name for m in probe.facts(Sysfs(tmp_path)).files] == ["nvidia_peermem"]


async def test_load_is_stale_when_a_required_module_went_away(tmp_path: Path) -> None:
    """Planned before an RDMA stack stop, applied after it: modprobe would load ib_core
    back as a dependency. The host drops it as stale and runs nothing."""
    from rdmad.kernel.apply.host import KernelHost

    gpu_node(tmp_path, loaded=("nvidia",))  # ib_core gone since the plan
    host = KernelHost(tmp_path, modprobe_program="/nonexistent/modprobe")
    action = LoadModule("peermem", "test", module="nvidia-peermem", requires=("nvidia", "ib_core"))
    result = await host.apply(action)
    assert result.stale and "ib_core no longer loaded" in result.note
    assert not host.records  # nothing was run or recorded as a write


COSTLY = (f"lib/modules/{RELEASE}/modules.dep", "proc/kallsyms")


def costly_reads(fs: CountingSysfs) -> list[str]:
    """The costly files read (a stat of modules.dep is no read of it)."""
    return [
        rel
        for how, rel in fs.asked
        if how in ("read", "read_bytes") and (rel in COSTLY or rel.endswith(".ko"))
    ]


def test_the_mode_decides_whether_the_module_tree_is_read(tmp_path: Path) -> None:
    gpu_node(tmp_path, loaded=("nvidia",))  # the GPU driver, no RDMA core yet
    for mode, probed in (("off", False), ("auto", False), ("require", True)):
        facts = PeermemProbe().facts(Sysfs(tmp_path), mode)  # type: ignore[arg-type]
        assert facts.probed is probed, mode
    gpu_node(tmp_path)  # and the RDMA core: auto's decision turns on the tree now
    for mode, probed in (("off", False), ("auto", True), ("require", True)):
        facts = PeermemProbe().facts(Sysfs(tmp_path), mode)  # type: ignore[arg-type]
        assert facts.probed is probed, mode


def test_nothing_declared_reads_neither_the_module_tree_nor_kallsyms(tmp_path: Path) -> None:
    """A GPU node with nothing declared (peermem off, no rxe link): the first pass reads
    no megabyte file. Declaring rxe asks rdma_rxe's availability; auto, peermem's."""
    gpu_node(tmp_path)
    fs = CountingSysfs(tmp_path)
    seen = observe(fs, scope=observe_scope(Desired()))
    assert costly_reads(fs) == []
    assert not seen.modules.peermem.probed and seen.modules.unavailable == ()
    assert plan(Desired(), seen, PlanState()) == []

    fs = CountingSysfs(tmp_path)
    rxe = validate(Desired, {"rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}]})
    seen = observe(fs, scope=observe_scope(rxe))
    assert f"lib/modules/{RELEASE}/modules.dep" in costly_reads(fs)
    assert not seen.modules.peermem.probed
    assert seen.modules.cannot_load("rdma_rxe") is not None  # not in this tree's modules.dep

    fs = CountingSysfs(tmp_path)
    auto = validate(Desired, {"peermem": {"mode": "auto"}})
    seen = observe(fs, scope=observe_scope(auto))
    assert "proc/kallsyms" in costly_reads(fs) and seen.modules.peermem.probed
    [load] = plan(auto, seen, PlanState())
    assert isinstance(load, LoadModule) and load.module == "nvidia-peermem"


def test_an_observer_nobody_told_reads_everything(tmp_path: Path) -> None:
    gpu_node(tmp_path)
    fs = CountingSysfs(tmp_path)
    seen = observe(fs)  # no scope: as the tools and the older callers observe
    assert seen.modules.peermem.probed and ObserveScope() == ObserveScope(
        modules=frozenset({"rdma_rxe"}), peermem="require"
    )
    assert f"lib/modules/{RELEASE}/modules.dep" in costly_reads(fs)
