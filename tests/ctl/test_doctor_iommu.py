"""The doctor's iommu check on fake trees: with no IOMMU group nothing is translated now,
and a translated default domain warns only where something RDMA-related is declared or
present (rdmad/doctor/iommu.py states the rule); the default domain from the kernel
log, else the command line, else the kernel's build config."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.doctor import Root, run_checks
from rdmad.doctor.report import Check
from tests.support.fakesysfs import RELEASE, FakeSysfs, gpu_node

CX = "0000:3b:00.0"
TRANSLATED_LOG = "6,1,1,-;iommu: Default domain type: Translated"
SRIOV = f'[[sriov]]\npf = {{ pci = "{CX}" }}\nnumvfs = 4\n'


def node(
    root: Path, cmdline: str = "root=/dev/sda1 ro", log: str | None = TRANSLATED_LOG
) -> FakeSysfs:
    """The report's node: a GPU, no RDMA device, no IOMMU group."""
    fs = gpu_node(root, loaded=("nvidia", "ib_core"), nvidia_taint="O")
    fs.pci("0000:17:00.0", "nvidia")
    fs.write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de")
    fs.write("proc/cmdline", cmdline)
    if log is not None:
        fs.write("dev/kmsg", log)
    return fs


def check(tmp_path: Path, config: str | None = None) -> Check:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    if config is not None:
        (etc / "rdmad.toml").write_text(config)
    report = run_checks(Root(str(tmp_path / "root")), str(etc))
    return next(c for c in report.checks if c.id == "iommu")


def test_translated_without_groups_and_nothing_rdma_related_is_info(tmp_path: Path) -> None:
    node(tmp_path / "root")
    c = check(tmp_path)
    assert c.status == "info" and c.suggestion == ""
    assert c.summary == (
        "nothing translated now (no IOMMU groups); default domain translated, nothing "
        "RDMA-related here"
    )
    assert "default domain: translated (the kernel log)" in c.evidence
    assert any(e.startswith("nothing RDMA-related:") for e in c.evidence)


@pytest.mark.parametrize(
    ("config", "present", "why"),
    [
        (SRIOV, None, "1 [[sriov]] PF(s) declared"),
        ('[peermem]\nmode = "auto"\n', None, '[peermem] mode = "auto" declared'),
        (None, "connectx", f"ConnectX function {CX}"),
        (None, "rdma-device", "RDMA device mlx5_0"),
        (None, "vf", "1 SR-IOV VF(s)"),
    ],
    ids=["sriov-declared", "peermem-declared", "connectx", "rdma-device", "vf"],
)
def test_translated_without_groups_warns_when_rdma_is_declared_or_present(
    tmp_path: Path, config: str | None, present: str | None, why: str
) -> None:
    fs = node(tmp_path / "root")
    if present == "connectx":
        fs.pci(CX)
        fs.write(f"sys/bus/pci/devices/{CX}/vendor", "0x15b3")
    elif present == "rdma-device":
        fs.pci(CX, "mlx5_core")
        fs.ib_device("mlx5_0", CX, "b8ce:f603:002e:a670")
    elif present == "vf":
        fs.pf("0000:5e:00.0", "ice", totalvfs=8, numvfs=1)
        fs.vf("0000:5e:00.0", 0, "0000:5e:01.0", "iavf", iommu_group=None)
    c = check(tmp_path, config)
    assert c.status == "warn"
    assert c.summary == (
        "nothing translated now (no IOMMU groups), but the default domain is translated: "
        "devices the IOMMU takes later, VFs included, would be (IBV_WC_LOC_PROT_ERR)"
    )
    assert c.suggestion.startswith("add iommu=pt to the kernel command line")
    assert f"RDMA-related: {why}" in c.evidence


def test_rxe_alone_is_not_rdma_related(tmp_path: Path) -> None:
    """Soft-RoCE moves data with the CPU: a translated IOMMU does not touch it."""
    fs = node(tmp_path / "root")
    fs.netdev("eth0", None, "52:54:00:ab:cd:ef")
    fs.ib_device("rxe0", None, "5054:00ff:feab:cdef", netdev="eth0", link_layer="Ethernet")
    c = check(tmp_path, '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n')
    assert c.status == "info"


@pytest.mark.parametrize(
    ("cmdline", "domain", "status"),
    [
        ("ro iommu.passthrough=0", "translated", "warn"),
        ("ro iommu=nopt", "translated", "warn"),
        ("ro iommu=pt", "passthrough", "info"),
        ("ro iommu.passthrough=1", "passthrough", "info"),
        ("ro iommu=pt iommu=nopt", "translated", "warn"),  # the last one decides
    ],
)
def test_without_the_kernel_log_the_command_line_says(
    tmp_path: Path, cmdline: str, domain: str, status: str
) -> None:
    node(tmp_path / "root", cmdline=cmdline, log=None)
    c = check(tmp_path, SRIOV)
    assert c.status == status
    assert f"default domain: {domain} (the kernel command line)" in c.evidence


@pytest.mark.parametrize(
    ("option", "domain", "status"),
    [
        ("CONFIG_IOMMU_DEFAULT_DMA_LAZY", "translated", "warn"),
        ("CONFIG_IOMMU_DEFAULT_DMA_STRICT", "translated", "warn"),
        ("CONFIG_IOMMU_DEFAULT_PASSTHROUGH", "passthrough", "info"),
    ],
)
def test_then_the_kernel_build(tmp_path: Path, option: str, domain: str, status: str) -> None:
    fs = node(tmp_path / "root", log=None)
    fs.write(f"boot/config-{RELEASE}", f"CONFIG_IOMMU_SUPPORT=y\n{option}=y\n")
    c = check(tmp_path, SRIOV)
    assert c.status == status
    assert f"default domain: {domain} (/boot/config-{RELEASE}: {option}=y)" in c.evidence


def test_not_known_is_said_not_guessed(tmp_path: Path) -> None:
    node(tmp_path / "root", log=None)
    c = check(tmp_path, SRIOV)
    assert c.status == "info"
    assert c.summary == "nothing translated now (no IOMMU groups); default domain not known"
    assert (
        "default domain: not known (the kernel log not readable, no iommu=pt|nopt or "
        f"iommu.passthrough= option, no CONFIG_IOMMU_DEFAULT_* in /boot/config-{RELEASE})"
    ) in c.evidence


def test_translated_groups_with_nothing_rdma_related_are_info(tmp_path: Path) -> None:
    fs = node(tmp_path / "root")
    fs.pci("0000:17:00.0", "nvidia", iommu_group=5)
    fs.write("sys/kernel/iommu_groups/5/type", "DMA-FQ")
    c = check(tmp_path)
    assert (c.status, c.summary) == ("info", "translated default domain; nothing RDMA-related here")
    c = check(tmp_path, SRIOV)
    assert (c.status, c.summary) == ("warn", "translated default domain and no iommu=pt")


@pytest.mark.parametrize("option", ["iommu=pt", "iommu.passthrough=y"])
def test_passthrough_on_the_command_line_with_groups_is_ok(tmp_path: Path, option: str) -> None:
    fs = node(tmp_path / "root", cmdline=f"ro intel_iommu=on {option}")
    fs.pci("0000:17:00.0", "nvidia", iommu_group=5)
    c = check(tmp_path, SRIOV)
    assert (c.status, c.summary) == ("ok", f"passthrough ({option})")


def test_the_pci_functions_are_read_once_for_both_checks(tmp_path: Path) -> None:
    """rdma-devices and iommu both ask about the ConnectX functions (a node has hundreds
    of PCI functions): one pass serves both."""
    node(tmp_path / "root")
    reads: list[str] = []

    class Counting(Root):
        def read(self, rel: str) -> str | None:
            reads.append(rel)
            return super().read(rel)

    checks = {c.id: c for c in run_checks(Counting(str(tmp_path / "root")), None).checks}
    assert checks["rdma-devices"].status == "fail" and checks["iommu"].status == "info"
    assert reads.count("sys/bus/pci/devices/0000:17:00.0/vendor") == 1
