"""rdmad.kernel.modules: sysfs reads on fake trees, modprobe for real."""

from __future__ import annotations

import errno
import shutil
import uuid
from pathlib import Path

import pytest

from rdmad.kernel.errors import KernelError
from rdmad.kernel.modules import Modules, canonical, modprobe, modprobe_remove
from rdmad.kernel.sysfs import Sysfs
from tests.support.fakesysfs import FakeSysfs, mlx5_node


def test_loaded_holders_refcount_and_params(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    fs.module("ib_core")
    fs.write("sys/module/ib_core/refcnt", "3")
    (tmp_path / "sys/module/ib_core/holders/mlx5_ib").mkdir()
    fs.module("vfio_pci", ids="8086:10ca")
    fs.write("sys/module/printk/parameters/time", "Y")  # a built-in: no initstate
    fs.write("sys/module/going_away/initstate", "going")
    mods = Modules(Sysfs(tmp_path))
    loaded = mods.loaded()
    assert {"mlx5_core", "rdma_rxe", "printk"} <= loaded
    assert "going_away" not in loaded
    info = mods.info("ib_core")
    assert info is not None and info.holders == ("mlx5_ib",) and info.refcnt == 3 and info.in_use
    vfio = mods.info("vfio-pci")  # modprobe spelling works too
    assert vfio is not None and vfio.params == {"ids": "8086:10ca"} and not vfio.in_use
    assert mods.param("vfio-pci", "ids") == "8086:10ca"
    assert mods.info("nvidia") is None and not mods.is_loaded("nvidia")
    assert canonical("nvidia-peermem") == "nvidia_peermem"


def test_loading_disabled_reasons(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    mods = Modules(Sysfs(tmp_path))
    assert mods.loading_disabled_reason() is None
    fs.write("proc/sys/kernel/modules_disabled", "1")
    assert "modules_disabled = 1" in (mods.loading_disabled_reason() or "")
    (tmp_path / "proc/sys/kernel/modules_disabled").unlink()
    assert "no loadable module support" in (mods.loading_disabled_reason() or "")
    fs.write("proc/modules", "")
    assert not mods.loading_disabled()


async def test_modules_disabled_refuses_before_running_modprobe(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.write("proc/sys/kernel/modules_disabled", "1")
    # A program that does not exist proves modprobe is never started.
    for call in (
        modprobe("rdma_rxe", sysfs=Sysfs(tmp_path), program="/nonexistent/modprobe"),
        modprobe_remove("rdma_rxe", sysfs=Sysfs(tmp_path), program="/nonexistent/modprobe"),
    ):
        with pytest.raises(KernelError) as info:
            await call
        assert info.value.errno == errno.EPERM
        assert "disabled" in str(info.value) and "modules_disabled = 1" in str(info.value)


async def test_bad_names_and_params_are_refused(tmp_path: Path) -> None:
    FakeSysfs(tmp_path)
    with pytest.raises(KernelError, match="not a module name"):
        await modprobe("-r", sysfs=Sysfs(tmp_path))
    with pytest.raises(KernelError, match="not a module parameter"):
        await modprobe("rdma_rxe", {"a b": "1"}, sysfs=Sysfs(tmp_path))


@pytest.mark.skipif(
    shutil.which("modprobe") is None and not Path("/sbin/modprobe").exists(),
    reason="no modprobe on this machine",
)
async def test_real_modprobe_of_missing_module_quotes_modprobe(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)  # modules_disabled 0: modprobe is really run
    del fs
    name = f"rdmad_nosuch_{uuid.uuid4().hex[:8]}"
    with pytest.raises(KernelError) as info:
        await modprobe(name, {"debug": 1}, sysfs=Sysfs(tmp_path))
    text = str(info.value)
    assert text.startswith(f"modprobe {name}: modprobe: FATAL: Module {name} not found"), text


async def test_missing_program_and_timeout(tmp_path: Path) -> None:
    FakeSysfs(tmp_path)
    with pytest.raises(KernelError, match="cannot run /nonexistent/modprobe") as info:
        await modprobe("x", sysfs=Sysfs(tmp_path), program="/nonexistent/modprobe")
    assert info.value.errno == errno.ENOENT
    sleeper = tmp_path / "slow-modprobe"
    sleeper.write_text("#!/bin/sh\nexec sleep 30\n")
    sleeper.chmod(0o755)
    with pytest.raises(KernelError, match=r"did not finish within 0.2 s") as info:
        await modprobe("x", sysfs=Sysfs(tmp_path), program=str(sleeper), timeout=0.2)
    assert info.value.errno == errno.ETIMEDOUT


async def test_failure_without_stderr_names_the_exit_status(tmp_path: Path) -> None:
    FakeSysfs(tmp_path)
    prog = tmp_path / "quiet-modprobe"
    prog.write_text("#!/bin/sh\nexit 3\n")
    prog.chmod(0o755)
    with pytest.raises(KernelError, match="quiet-modprobe exited with status 3"):
        await modprobe_remove("x", sysfs=Sysfs(tmp_path), program=str(prog))


async def test_insert_failure_carries_the_kernel_log_written_during_it(tmp_path: Path) -> None:
    """modprobe says "see dmesg"; the error carries what the kernel said during this load
    only (an old line from an earlier attempt stays out)."""
    fs = FakeSysfs(tmp_path)
    old = "4,900,1000,-;nvidia_peermem: Unknown symbol ib_query_port (err -2)"
    fs.write("dev/kmsg", old)
    prog = tmp_path / "fake-modprobe"
    prog.write_text(
        "#!/bin/sh\n"
        f"echo '4,1043,81234567,-;nvidia_peermem: disagrees about version of symbol "
        f"ib_register_peer_memory_client' >> {tmp_path}/dev/kmsg\n"
        f"echo '6,1044,81234568,-;eth0: link up' >> {tmp_path}/dev/kmsg\n"
        "echo \"modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument\" >&2\n"
        "exit 1\n"
    )
    prog.chmod(0o755)
    with pytest.raises(KernelError) as info:
        await modprobe("nvidia-peermem", sysfs=Sysfs(tmp_path), program=str(prog))
    text = str(info.value)
    assert text == (
        "modprobe nvidia-peermem: modprobe: ERROR: could not insert 'nvidia_peermem': "
        "Invalid argument; kernel log: nvidia_peermem: disagrees about version of symbol "
        "ib_register_peer_memory_client"
    )


async def test_insert_failure_without_a_readable_kernel_log_is_modprobes_words(
    tmp_path: Path,
) -> None:
    FakeSysfs(tmp_path)  # no dev/kmsg
    prog = tmp_path / "fake-modprobe"
    prog.write_text("#!/bin/sh\necho 'modprobe: ERROR: could not insert' >&2\nexit 1\n")
    prog.chmod(0o755)
    with pytest.raises(KernelError, match=r"could not insert$"):
        await modprobe("nvidia-peermem", sysfs=Sysfs(tmp_path), program=str(prog))
