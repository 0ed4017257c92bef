"""Why rdma_rxe cannot be loaded, said as it is: no module support (a kernel built
without CONFIG_MODULES has no /proc/modules and no modules_disabled), modules_disabled
= 1, or no rdma_rxe for the running kernel; the doctor, `rdmad plan` and the status (the
planner's reason) say the same, from the same reads (rdmad.modsupport). And no guard
hook for a module that cannot exist: a built-in driver, rdma_rxe built in, or any
module on a kernel without module support."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from rdmad import cli, modsupport
from rdmad.doctor import Root, run_checks
from rdmad.doctor.checks import module_loading
from rdmad.doctor.checks import rxe as rxe_check
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import (
    AddRxe,
    Desired,
    LoadModule,
    PlanState,
    SyncGuardHook,
    summarize,
)
from rdmad.model.validation import validate
from rdmad.peermem.facts import gather
from rdmad.peermem.findings import preflight
from rdmad.reconcile import declared_objects, plan
from tests.support.fakesysfs import IGB_PF, RELEASE, FakeSysfs

NO_SUPPORT = (
    "this kernel has no loadable module support (built without CONFIG_MODULES): "
    "rdma_rxe must be built in"
)
DISABLED = (
    "rdma_rxe is not loaded and module loading is disabled until reboot "
    "(/proc/sys/kernel/modules_disabled = 1)"
)
BASE = f"lib/modules/{RELEASE}"
RXE_KO = "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"


def tree(root: Path, kind: str) -> FakeSysfs:
    """A node with eth0 and no rdma_rxe loaded; ``kind`` says what its kernel can do:

    * no-modules: built without CONFIG_MODULES (no /proc/modules, no modules_disabled,
      no module tree), rdma_rxe not built in (kallsyms lacks its symbols);
    * no-modules-rxe-builtin: the same, with rdma_rxe built in (kallsyms has it);
    * disabled: modules_disabled = 1, rdma_rxe installed;
    * missing: modules load, but modules.dep has no rdma_rxe;
    * installed: modules load, rdma_rxe in modules.dep;
    * builtin: modules load, modules.builtin lists rdma_rxe.
    """
    fs = FakeSysfs(root)
    fs.write("proc/sys/kernel/osrelease", RELEASE)
    fs.pci("0000:00:03.0", "virtio-pci")
    fs.netdev("eth0", "0000:00:03.0", "52:54:00:ab:cd:ef")
    fs.builtin_module("ib_core")
    if kind.startswith("no-modules"):
        (root / "proc/sys/kernel/modules_disabled").unlink()
        syms = ["ffffffff81000000 T _stext", "ffffffff81a00000 T ib_register_device"]
        if kind == "no-modules-rxe-builtin":
            syms.append("ffffffff81b00000 T rxe_net_add")
        fs.write("proc/kallsyms", "\n".join(syms))
        return fs
    fs.proc_modules("virtio_net")
    fs.write("proc/sys/kernel/modules_disabled", "1" if kind == "disabled" else "0")
    dep = ["kernel/drivers/net/virtio_net.ko:"]
    if kind in ("disabled", "installed"):
        dep.append(f"{RXE_KO}: kernel/drivers/infiniband/core/ib_core.ko")
    fs.write(f"{BASE}/modules.dep", "\n".join(dep))
    builtin = ["kernel/drivers/infiniband/core/ib_core.ko"]
    if kind == "builtin":
        builtin.append(RXE_KO)
    fs.write(f"{BASE}/modules.builtin", "\n".join(builtin))
    return fs


def rxe_declared() -> Desired:
    return validate(Desired, {"rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}]})


def planned(root: Path) -> tuple[list[object], str]:
    """The daemon's plan for the tree and the status line of the rxe object."""
    d = rxe_declared()
    actions = plan(d, observe(Sysfs(root)), PlanState())
    [status] = [s for s in summarize(declared_objects(d), actions) if s.obj == "rxe rxe0"]
    return list(actions), f"{status.state.value}: {status.message}"


# --- the daemon: plan and status ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("no-modules", NO_SUPPORT),
        ("disabled", DISABLED),
        ("missing", f"no rdma_rxe module for the running kernel {RELEASE} "
                    f"(/{BASE}/modules.dep has no rdma_rxe)"),
    ],
)  # fmt: skip
def test_the_plan_names_the_real_reason(tmp_path: Path, kind: str, words: str) -> None:
    tree(tmp_path, kind)
    actions, status = planned(tmp_path)
    assert status.startswith(f"blocked: {words}"), status
    assert not any(isinstance(a, LoadModule | AddRxe) for a in actions)
    if kind != "disabled":
        assert "modules_disabled" not in status  # a file that is not there, or says 0


@pytest.mark.parametrize("kind", ["builtin", "no-modules-rxe-builtin"])
def test_a_built_in_rdma_rxe_is_neither_loaded_nor_guarded(tmp_path: Path, kind: str) -> None:
    tree(tmp_path, kind)
    actions, _ = planned(tmp_path)
    assert [type(a) for a in actions if a.obj == "rxe rxe0"] == [AddRxe]
    assert not any(isinstance(a, SyncGuardHook) for a in actions), actions


def test_a_loadable_rdma_rxe_is_loaded_and_guarded(tmp_path: Path) -> None:
    tree(tmp_path, "installed")
    actions, _ = planned(tmp_path)
    assert [type(a) for a in actions if a.obj == "rxe rxe0"] == [LoadModule, AddRxe]
    [hook] = [a for a in actions if isinstance(a, SyncGuardHook)]
    assert hook.modules == ("rdma_rxe",)


def test_no_guard_hook_for_rdma_rxe_without_module_support(tmp_path: Path) -> None:
    tree(tmp_path, "no-modules")
    actions, _ = planned(tmp_path)
    assert not any(isinstance(a, SyncGuardHook) for a in actions), actions


def test_no_guard_hook_for_a_built_in_pf_driver(tmp_path: Path) -> None:
    """igb built in, with parameters: /sys/module/igb exists (no initstate) and the
    driver's `module` link points at it, as the kernel makes it for built-in drivers."""
    fs = tree(tmp_path, "installed")
    fs.pf(IGB_PF, "igb", totalvfs=7, numvfs=0)
    fs.builtin_module("igb", max_vfs="0")
    fs.link("sys/bus/pci/drivers/igb/module", "../../../../module/igb")
    d = validate(Desired, {"sriov": [{"pf": {"pci": IGB_PF}, "numvfs": 0}]})
    observed = observe(Sysfs(tmp_path))
    [pf] = observed.pfs
    assert pf.driver == "igb" and pf.driver_module is None
    actions = plan(d, observed, PlanState())
    assert not any(isinstance(a, SyncGuardHook) for a in actions), actions
    fs.module("igb")  # the same driver as a loadable module: guarded
    actions = plan(d, observe(Sysfs(tmp_path)), PlanState())
    assert [a.modules for a in actions if isinstance(a, SyncGuardHook)] == [("igb",)]


def test_rdmad_plan_prints_the_reason(tmp_path: Path) -> None:
    tree(tmp_path / "root", "no-modules")
    cfg = tmp_path / "rdmad.toml"
    cfg.write_text('[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", "--root", str(tmp_path / "root"), "--config", str(cfg)])
    assert code == 1  # the rxe link stays blocked: the plan cannot reach the declaration
    assert NO_SUPPORT in out.getvalue(), out.getvalue()
    assert "modules_disabled" not in out.getvalue()


# --- the doctor -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "words"),
    [
        ("no-modules", "info", NO_SUPPORT),
        ("no-modules-rxe-builtin", "ok", "rdma_rxe built in"),
        ("disabled", "warn", DISABLED),
        ("missing", "info", f"no rdma_rxe module for the running kernel {RELEASE}"),
        ("installed", "ok", "rdma_rxe available"),
        ("builtin", "ok", "rdma_rxe built in"),
    ],
)
def test_the_doctor_names_the_real_reason(
    tmp_path: Path, kind: str, status: str, words: str
) -> None:
    tree(tmp_path, kind)
    check = rxe_check(Root(str(tmp_path)), RELEASE)
    assert (check.status, check.summary.startswith(words)) == (status, True), check


def test_the_doctor_quotes_no_file_a_kernel_without_modules_lacks(tmp_path: Path) -> None:
    tree(tmp_path, "no-modules")
    check = module_loading(Root(str(tmp_path)))
    assert check.summary.startswith(modsupport.NO_SUPPORT)
    text = "\n".join(run_checks(Root(str(tmp_path)), None).lines())
    assert "modules_disabled =" not in text, text
    assert NO_SUPPORT in text


def test_modsupport_tells_the_three_apart(tmp_path: Path) -> None:
    for kind, level in (("no-modules", "none"), ("disabled", "disabled"), ("missing", "loadable")):
        tree(tmp_path / kind, kind)
        assert modsupport.support(Root(str(tmp_path / kind))) == level


def test_peermem_says_no_module_support_not_modules_disabled(tmp_path: Path) -> None:
    tree(tmp_path, "no-modules")
    facts = gather(Root(str(tmp_path)))
    assert facts.module_support is False and facts.loading_disabled is None
    # Neither file exists there: that is the answer, not a read that failed.
    assert not any("modules_disabled" in u or "/proc/modules" in u for u in facts.unread)
    [finding] = preflight(facts)
    assert finding.id == "no-module-support" and finding.evidence == modsupport.NO_SUPPORT
