"""observe() carries the peer-memory facts; the probe reads the module tree only while a
GPU driver is loaded, and again only when what it depends on changed."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.apply.observe import observe
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Desired, LoadModule, PeermemSpec, PlanState
from rdmad.reconcile import plan
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
