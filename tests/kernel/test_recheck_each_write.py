"""A destructive write is re-checked right before it runs, not once per action.

Binding a VF to another driver loads the module first (modprobe, up to its timeout),
writes driver_override, and only then unbinds; a GUID change writes the GUIDs, then
unbinds and re-probes. A holder that appears while the earlier writes run (a VM that
opens the VF, a verbs job on its RDMA device, libvirt re-binding it) must keep the
unbind from happening: the action is stale, naming the holder, and planned again.

The slow step is real: a modprobe program that blocks until the test releases it,
or a GUID store that blocks in its thread; the holder appears while it blocks.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.apply.results import ApplyResult, Outcome
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.model import BindVfDriver, Blocked, Desired, PlanState, SetIbVf, VfChange
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from tests.kernel.test_host import KernelishSysfs
from tests.support.fakesysfs import DEV, MLX5_PF, MLX5_VFS, FakeSysfs, mlx5_node

VF = MLX5_VFS[2]  # on mlx5_core, its RDMA device mlx5_4, nobody holds it
DEADLINE = 20.0
UNBIND = "sys/bus/pci/drivers/mlx5_core/unbind"


class SlowModprobe:
    """A modprobe program that says it started, then waits for the test's go."""

    def __init__(self, root: Path) -> None:
        self.started = root / "modprobe-started"
        self.fifo = root / "modprobe-go"
        os.mkfifo(self.fifo)
        self.program = root / "slow-modprobe"
        self.program.write_text(
            f"#!/bin/sh\n: > '{self.started}'\nread go < '{self.fifo}'\nexit 0\n"
        )
        self.program.chmod(0o755)

    async def wait_started(self) -> None:
        await until(self.started.exists, "the modprobe to start")

    async def release(self) -> None:
        def go() -> None:
            with open(self.fifo, "w") as fh:  # blocks until the script reads: bounded below
                fh.write("go\n")

        await asyncio.wait_for(asyncio.to_thread(go), DEADLINE)


async def until(cond: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"{what}: not within {DEADLINE:g} s")
        await asyncio.sleep(0.01)


def verbs_job(fs: FakeSysfs) -> str:
    fs.process(777, "ib_write_bw", fs.uverbs(9, "mlx5_4"))
    return "pid 777 (ib_write_bw) holds /dev/infiniband/uverbs9"


def vm_defined(fs: FakeSysfs) -> str:
    fs.libvirt_domain(
        "vm2",
        "<interface type='hostdev' managed='yes'><source><address type='pci' domain='0x0000' "
        "bus='0x3b' slot='0x00' function='0x4'/></source></interface>",
    )
    return "libvirt domain 'vm2' has it as a hostdev"


def vm_took_it(fs: FakeSysfs) -> str:
    """libvirt detached the VF to vfio-pci and QEMU opened its group."""
    fs.bind(VF, "vfio-pci")
    fs.process(778, "qemu-system-x86", "/dev/vfio/62")
    return "bound to vfio-pci, not mlx5_core"


HOLDERS = {"verbs-job": verbs_job, "vm-defined": vm_defined, "vm-took-it": vm_took_it}


def host_on(root: Path, **kw: object) -> KernelHost:
    host = KernelHost(root, modprobe_timeout=DEADLINE, **kw)  # type: ignore[arg-type]
    host.sysfs = KernelishSysfs(root)
    return host


async def apply_while(
    host: KernelHost,
    action: object,
    started: Callable[[], Awaitable[None]],
    release: Callable[[], Awaitable[None]],
    during: Callable[[], object],
) -> ApplyResult:
    task = asyncio.ensure_future(host.apply(action))  # type: ignore[arg-type]
    try:
        await started()
        during()
        await release()
        return await asyncio.wait_for(task, DEADLINE)
    finally:
        task.cancel()


def bind_to_vfio() -> BindVfDriver:
    return BindVfDriver(
        f"sriov pci={MLX5_PF}",
        "VF 2 is declared with driver vfio-pci",
        vf_pci=VF,
        old="mlx5_core",
        new="vfio-pci",
        load_module=True,
    )


@pytest.mark.parametrize("holder", HOLDERS)
async def test_a_holder_that_appears_during_modprobe_keeps_the_unbind_from_happening(
    tmp_path: Path, holder: str
) -> None:
    fs = mlx5_node(tmp_path)
    slow = SlowModprobe(tmp_path)
    host = host_on(tmp_path, modprobe_program=str(slow.program))
    named: list[str] = []
    result = await apply_while(
        host,
        bind_to_vfio(),
        slow.wait_started,
        slow.release,
        lambda: named.append(HOLDERS[holder](fs)),
    )
    assert result.outcome is Outcome.STALE, result.describe()
    assert named[0] in result.note
    assert f"not done: {VF} driver, {VF} driver" in result.note  # neither unbind nor probe
    # What ran before the re-check is reported (the agent puts it in history).
    assert [(w.target, w.old, w.new, w.ok) for w in result.writes] == [
        ("module vfio-pci", "not loaded", "loaded", True),
        (f"{VF} driver_override", None, "vfio-pci", True),
    ]
    assert (tmp_path / UNBIND).read_text() == ""  # never written
    if holder != "vm-took-it":
        assert Sysfs(tmp_path).link_name(f"{PCI_DEVICES}/{VF}/driver") == "mlx5_core"


async def test_without_a_holder_the_bind_goes_through_after_the_slow_modprobe(
    tmp_path: Path,
) -> None:
    """The control: the same slow modprobe, nobody appears, the VF is bound."""
    mlx5_node(tmp_path)
    slow = SlowModprobe(tmp_path)
    host = host_on(tmp_path, modprobe_program=str(slow.program))
    result = await apply_while(host, bind_to_vfio(), slow.wait_started, slow.release, lambda: 0)
    assert result.outcome is Outcome.APPLIED, result.describe()
    assert [w.target for w in result.writes] == [
        "module vfio-pci",
        f"{VF} driver_override",
        f"{VF} driver",
        f"{VF} driver",
    ]
    assert (tmp_path / UNBIND).read_text() == VF
    assert Sysfs(tmp_path).link_name(f"{PCI_DEVICES}/{VF}/driver") == "vfio-pci"


async def test_next_pass_plans_again_and_names_the_holder(tmp_path: Path) -> None:
    """After the stale drop, a new observation plans no rebind: it blocks, naming the job."""
    fs = mlx5_node(tmp_path)
    shutil.rmtree(tmp_path / "sys/module/vfio_pci")  # not loaded: the bind loads it
    desired = validate(
        Desired,
        {
            "sriov": [
                {"pf": {"pci": MLX5_PF}, "numvfs": 4, "vf": [{"index": 2, "driver": "vfio-pci"}]}
            ]
        },
    )
    planned = plan(desired, observe(Sysfs(tmp_path)), PlanState())
    [bind] = [a for a in planned if isinstance(a, BindVfDriver)]
    assert bind.load_module
    slow = SlowModprobe(tmp_path)
    host = host_on(tmp_path, modprobe_program=str(slow.program))
    holder: list[str] = []
    result = await apply_while(
        host, bind, slow.wait_started, slow.release, lambda: holder.append(verbs_job(fs))
    )
    assert result.stale and holder[0] in result.note
    again = plan(desired, observe(Sysfs(tmp_path)), PlanState())
    assert not [a for a in again if isinstance(a, BindVfDriver)]
    [blocked] = [a for a in again if isinstance(a, Blocked)]
    assert "must be re-bound to bind to vfio-pci, but it is in use" in blocked.reason
    assert holder[0] in blocked.reason


async def test_a_holder_that_appears_during_the_guid_writes_keeps_the_rebind_from_happening(
    tmp_path: Path,
) -> None:
    fs = mlx5_node(tmp_path)
    began, go = threading.Event(), threading.Event()

    class SlowGuids(KernelishSysfs):
        def write(self, rel: str, value: str, *, op: str | None = None) -> None:
            if rel.endswith("/sriov/0/node"):  # the driver's GUID store blocks a while
                began.set()
                go.wait(DEADLINE)
            super().write(rel, value, op=op)

    host = KernelHost(tmp_path)
    host.sysfs = SlowGuids(tmp_path)
    action = SetIbVf(
        f"sriov pci={MLX5_PF}",
        "restore InfiniBand identity of VF 0",
        pci=MLX5_PF,
        ib_device="mlx5_0",
        vf=0,
        vf_pci=MLX5_VFS[0],
        changes=(VfChange(0, "node_guid", "00:00:00:00:00:00:00:00", "00:11:22:33:44:55:66:77"),),
        rebind=True,
        vf_driver="mlx5_core",
    )

    async def started() -> None:
        await until(began.is_set, "the GUID write to start")

    async def release() -> None:
        go.set()

    def job() -> None:  # a verbs job opens the VF's RDMA device (mlx5_2)
        fs.process(779, "ib_send_bw", fs.uverbs(4, "mlx5_2"))

    result = await apply_while(host, action, started, release, job)
    assert result.outcome is Outcome.STALE, result.describe()
    assert "pid 779 (ib_send_bw) holds /dev/infiniband/uverbs4" in result.note
    assert [w.target for w in result.writes] == ["mlx5_0 vf 0 node_guid"]
    assert (tmp_path / UNBIND).read_text() == ""
    assert Sysfs(tmp_path).link_name(f"{PCI_DEVICES}/{MLX5_VFS[0]}/driver") == "mlx5_core"
    assert (tmp_path / DEV / MLX5_PF / "sriov/0/node").read_text() == "00:11:22:33:44:55:66:77"
