"""observe() carries the peer-memory facts; the probe reads the module tree only where
the declared mode's decision can turn on it (a GPU driver loaded; for auto the RDMA core
too), and again only when what it depends on changed. Nothing declared that can load a
module: neither the module tree nor /proc/kallsyms is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.kernel.apply.observe import observe
from rdmad.kernel.peermem_probe import PeermemProbe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Desired, LoadModule, ObserveScope, PeermemSpec, PlanState
from rdmad.model.validation import validate
from rdmad.peermem.choice import decide
from rdmad.peermem.facts import gather
from rdmad.reconcile import observe_scope, plan
from tests.support.countingsysfs import CountingSysfs
from tests.support.fakesysfs import PEERMEM_KO, RELEASE, SIGNED, gpu_node


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


INBOX = {PEERMEM_KO: b"ib_register_client" + SIGNED}  # built against the inbox ib_core
MOFED = {PEERMEM_KO: b"ib_register_peer_memory_client" + SIGNED}


DMABUF = ("ib_umem_get", "ib_umem_dmabuf_get")  # ib_uverbs' functions, as its BTF names them


@pytest.mark.parametrize(
    ("installed", "taint", "release", "btf", "read"),
    [
        (INBOX, "PO", RELEASE, None, False),  # the proprietary driver: no DMA-BUF finding
        (INBOX, "O", "5.4.0-216-generic", None, False),  # open modules, before DMA-BUF
        ({}, "PO", RELEASE, None, False),  # nothing installed: the finding says so
        (MOFED, "PO", RELEASE, DMABUF, True),  # the module needs the peer-memory API
        (INBOX, "O", RELEASE, None, True),  # open modules on 6.1, no BTF: the DMA-BUF note
        (INBOX, "O", RELEASE, DMABUF, False),  # the same with BTF naming the function
        (INBOX, "O", RELEASE, DMABUF[:1], True),  # BTF that leaves it out: not a "no"
        ({"updates/dkms/nvidia-peermem.ko.zst": b"\x28\xb5\x2f\xfd"}, "PO", RELEASE, None, True),
    ],
)
def test_kallsyms_is_read_only_where_a_finding_can_turn_on_it(
    tmp_path: Path,
    installed: dict[str, bytes],
    taint: str,
    release: str,
    btf: tuple[str, ...] | None,
    read: bool,
) -> None:
    """The kernel formats /proc/kallsyms as it is read (tens of ms on a real node): a
    pass reads it for the peer-memory API only when the module needs it or cannot be
    told (zstd), and for the DMA-BUF symbol only where its info finding can be made and
    the kernel's BTF does not name it. The decision is the doctor's, who reads every
    symbol."""
    gpu_node(tmp_path, installed=installed, nvidia_taint=taint, release=release, btf=btf)
    fs = CountingSysfs(tmp_path)
    facts = PeermemProbe().facts(fs, "auto")
    assert facts.probed
    assert ("proc/kallsyms" in costly_reads(fs)) is read
    assert not [rel for rel in costly_reads(fs) if rel.endswith("ib_core.ko")]
    everything = gather(Sysfs(tmp_path), full=True)
    for mode in ("auto", "require"):
        assert decide(mode, facts) == decide(mode, everything), mode


def btf_reads(fs: CountingSysfs) -> list[str]:
    return [rel for how, rel in fs.asked if how == "read_bytes" and "/btf/" in rel]


def test_the_dmabuf_symbol_comes_from_the_btf_of_the_code_that_holds_it(tmp_path: Path) -> None:
    """ib_uverbs' own BTF while it is a loaded module, vmlinux's when it is built in
    (its class directory, no /proc/modules line, no /sys/module entry); neither and no
    kallsyms while no ib_uverbs is there: nothing has the function then."""
    loaded = ("nvidia", "ib_core", "mlx5_core", "mlx5_ib")
    cases = {  # name -> (loaded, ib_uverbs built in, BTF read, the DMA-BUF fact)
        "module": ((*loaded, "ib_uverbs"), False, ["sys/kernel/btf/ib_uverbs"], True),
        "built in": (loaded, True, ["sys/kernel/btf/vmlinux"], True),
        "absent": (loaded, False, [], None),
    }
    for name, (mods, builtin, read, dmabuf) in cases.items():
        root = tmp_path / name.replace(" ", "_")
        gpu_node(root, loaded=mods, installed=INBOX, nvidia_taint="O", btf=DMABUF)
        if builtin:
            (root / "sys/class/infiniband_verbs").mkdir(parents=True, exist_ok=True)
        fs = CountingSysfs(root)
        facts = PeermemProbe().facts(fs, "auto")
        assert btf_reads(fs) == read, name
        assert "proc/kallsyms" not in costly_reads(fs), name
        assert facts.dmabuf_symbol is dmabuf, name
        everything = gather(Sysfs(root), full=True)
        assert everything.dmabuf_symbol is dmabuf, name  # the doctor's answer
        assert decide("auto", facts) == decide("auto", everything), name
        assert ("dmabuf-available" in [f.id for f in decide("auto", facts).findings]) is bool(
            dmabuf
        ), name
