"""Builds fake sysfs/procfs trees laid out like the real ones (symlinks included).

Real layout being mirrored (kernel 6.1):

  sys/devices/pci0000:00/BDF/                 the device directory
  sys/bus/pci/devices/BDF -> ../../../devices/pci0000:00/BDF
  BDF/driver -> ../../../bus/pci/drivers/DRV
  BDF/virtfnN -> ../VF_BDF,  VF_BDF/physfn -> ../PF_BDF
  BDF/net/NAME/,  sys/class/net/NAME -> ../../devices/pci0000:00/BDF/net/NAME
  BDF/infiniband/DEV/,  sys/class/infiniband/DEV -> ../../devices/pci0000:00/BDF/infiniband/DEV
  BDF/iommu_group -> ../../../kernel/iommu_groups/N
  sys/module/MOD/initstate = live
  proc/PID/fd/N -> /dev/vfio/GROUP,  proc/PID/comm
"""

from __future__ import annotations

import os
from pathlib import Path

DEV = "sys/devices/pci0000:00"


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for d in (
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/class/net",
            "sys/class/infiniband",
            "sys/class/infiniband_verbs",
            "sys/module",
            "sys/kernel/iommu_groups",
            "proc/sys/kernel",
            DEV,
        ):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.write("proc/sys/kernel/modules_disabled", "0")
        self.write("proc/cmdline", "root=/dev/sda1 ro iommu=pt")
        self.write("sys/bus/pci/drivers_probe", "")
        self._ifindex = 1

    # --- primitives -----------------------------------------------------------------

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n" if text else "")

    def link(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        os.symlink(target, path)

    # --- devices ----------------------------------------------------------------------

    def driver(self, name: str) -> None:
        for f in ("bind", "unbind", "new_id"):
            p = self.root / f"sys/bus/pci/drivers/{name}/{f}"
            if not p.exists():
                self.write(f"sys/bus/pci/drivers/{name}/{f}", "")

    def pci(self, bdf: str, driver: str | None = None, iommu_group: int | None = None) -> Path:
        d = self.root / DEV / bdf
        d.mkdir(parents=True, exist_ok=True)
        self.link(f"sys/bus/pci/devices/{bdf}", f"../../../devices/pci0000:00/{bdf}")
        self.link(f"{DEV}/{bdf}/subsystem", "../../../bus/pci")
        self.write(f"{DEV}/{bdf}/driver_override", "(null)")
        if driver:
            self.bind(bdf, driver)
        if iommu_group is not None:
            (self.root / f"sys/kernel/iommu_groups/{iommu_group}").mkdir(
                parents=True, exist_ok=True
            )
            self.write(f"sys/kernel/iommu_groups/{iommu_group}/type", "identity")
            self.link(f"{DEV}/{bdf}/iommu_group", f"../../../kernel/iommu_groups/{iommu_group}")
        return d

    def bind(self, bdf: str, driver: str) -> None:
        self.driver(driver)
        self.link(f"{DEV}/{bdf}/driver", f"../../../bus/pci/drivers/{driver}")
        self.link(f"sys/bus/pci/drivers/{driver}/{bdf}", f"../../../../devices/pci0000:00/{bdf}")

    def driver_module(self, driver: str, module: str) -> None:
        """A loadable module behind a PCI driver: drivers/DRV/module and module/MOD/drivers."""
        self.driver(driver)
        self.module(module)
        self.link(f"sys/bus/pci/drivers/{driver}/module", f"../../../../module/{module}")
        self.link(f"sys/module/{module}/drivers/pci:{driver}", f"../../../bus/pci/drivers/{driver}")

    def pf(
        self,
        bdf: str,
        driver: str,
        totalvfs: int,
        numvfs: int = 0,
        *,
        vendor: str | None = None,
        device: str | None = None,
    ) -> None:
        """An SR-IOV PF; ``vendor``/``device`` as sysfs prints them ("0x8086")."""
        self.pci(bdf, driver)
        for name, value in (("vendor", vendor), ("device", device)):
            if value is not None:
                self.write(f"{DEV}/{bdf}/{name}", value)
        self.write(f"{DEV}/{bdf}/sriov_totalvfs", str(totalvfs))
        self.write(f"{DEV}/{bdf}/sriov_numvfs", str(numvfs))
        self.write(f"{DEV}/{bdf}/sriov_drivers_autoprobe", "1")

    def vf(
        self, pf: str, index: int, bdf: str, driver: str | None, iommu_group: int | None
    ) -> None:
        self.pci(bdf, driver, iommu_group)
        self.link(f"{DEV}/{pf}/virtfn{index}", f"../{bdf}")
        self.link(f"{DEV}/{bdf}/physfn", f"../{pf}")

    def netdev(
        self,
        name: str,
        bdf: str | None,
        mac: str,
        up: bool = True,
        *,
        phys_port_name: str | None = None,
        dev_port: int = 0,
    ) -> None:
        base = f"{DEV}/{bdf}/net/{name}" if bdf else f"sys/devices/virtual/net/{name}"
        rel_from_class = "../../" + base.removeprefix("sys/")
        self.link(f"sys/class/net/{name}", rel_from_class)
        self.write(f"{base}/address", mac)
        self.write(f"{base}/ifindex", str(self._next_ifindex()))
        self.write(f"{base}/flags", "0x1003" if up else "0x1002")
        self.write(f"{base}/operstate", "up" if up else "down")
        self.write(f"{base}/dev_port", str(dev_port))
        if phys_port_name is not None:
            self.write(f"{base}/phys_port_name", phys_port_name)
        if bdf:
            self.link(f"{base}/device", f"../../../{bdf}")

    def vfio_cdev(self, bdf: str, index: int) -> str:
        """iommufd's per-device node: BDF/vfio-dev/vfioN <-> /dev/vfio/devices/vfioN."""
        (self.root / f"{DEV}/{bdf}/vfio-dev/vfio{index}").mkdir(parents=True, exist_ok=True)
        return f"/dev/vfio/devices/vfio{index}"

    def libvirt_domain(self, name: str, devices_xml: str) -> None:
        """A running domain's status file as libvirt keeps it in /run/libvirt/qemu."""
        self.write(
            f"run/libvirt/qemu/{name}.xml",
            f"<domstatus><domain><name>{name}</name><devices>{devices_xml}"
            "</devices></domain></domstatus>",
        )

    def _next_ifindex(self) -> int:
        self._ifindex += 1
        return self._ifindex

    def ib_device(
        self,
        name: str,
        bdf: str | None,
        node_guid: str,
        netdev: str | None = None,
        link_layer: str = "InfiniBand",
    ) -> None:
        if bdf:
            base = f"{DEV}/{bdf}/infiniband/{name}"
            self.link(
                f"sys/class/infiniband/{name}", f"../../devices/pci0000:00/{bdf}/infiniband/{name}"
            )
            self.link(f"{base}/device", f"../../../{bdf}")
        else:  # rxe: a virtual device with a 'parent' attribute naming its netdev
            base = f"sys/devices/virtual/infiniband/{name}"
            self.link(f"sys/class/infiniband/{name}", f"../../devices/virtual/infiniband/{name}")
            self.write(f"{base}/parent", netdev or "")
        self.write(f"{base}/node_guid", node_guid)
        self.write(f"{base}/ports/1/link_layer", link_layer)
        self.write(f"{base}/ports/1/state", "4: ACTIVE")
        if netdev:
            self.write(f"{base}/ports/1/gid_attrs/ndevs/0", netdev)

    def ib_vf(self, ib_dev: str, bdf: str, vf: int, node: str, port: str, policy: str) -> None:
        base = f"{DEV}/{bdf}/sriov/{vf}"
        self.write(f"{base}/node", node)
        self.write(f"{base}/port", port)
        self.write(f"{base}/policy", policy)

    def uverbs(self, index: int, ib_dev: str) -> str:
        self.write(f"sys/class/infiniband_verbs/uverbs{index}/ibdev", ib_dev)
        return f"/dev/infiniband/uverbs{index}"

    def module(self, name: str, **params: str) -> None:
        self.write(f"sys/module/{name}/initstate", "live")
        self.write(f"sys/module/{name}/refcnt", "0")
        (self.root / f"sys/module/{name}/holders").mkdir(parents=True, exist_ok=True)
        for key, value in params.items():
            self.write(f"sys/module/{name}/parameters/{key}", value)

    def builtin_module(self, name: str, **params: str) -> None:
        """A built-in: /sys/module/NAME (parameters only), no initstate, no holders."""
        (self.root / f"sys/module/{name}").mkdir(parents=True, exist_ok=True)
        for key, value in params.items():
            self.write(f"sys/module/{name}/parameters/{key}", value)

    def btf(self, name: str, *functions: str) -> None:
        """/sys/kernel/btf/NAME: a BTF header, then a string section naming FUNCTIONS
        (the first string is the empty one, as in the kernel's)."""
        strings = b"\0" + b"".join(f.encode() + b"\0" for f in functions)
        path = self.root / f"sys/kernel/btf/{name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x9f\xeb\x01\x00" + bytes(20) + strings)

    def proc_modules(self, *names: str) -> None:
        """/proc/modules listing NAMEs as Live (what the kernel lists: loadable ones)."""
        lines = [f"{n} 16384 0 - Live 0x0000000000000000" for n in names]
        self.write("proc/modules", "\n".join(lines))

    def process(self, pid: int, comm: str, *open_files: str) -> None:
        self.write(f"proc/{pid}/comm", comm)
        (self.root / f"proc/{pid}/fd").mkdir(parents=True, exist_ok=True)
        for fd, target in enumerate(open_files, start=3):
            self.link(f"proc/{pid}/fd/{fd}", target)


# --- ready-made trees ---

RELEASE = "6.1.0-26-amd64"
PEERMEM_KO = "updates/dkms/nvidia-peermem.ko"
SIGNED = b"\x7fELF...module body...~Module signature appended~\n"
UNSIGNED = b"\x7fELF...module body..."


def gpu_node(
    root: Path,
    *,
    loaded: tuple[str, ...] = ("nvidia", "ib_core", "ib_uverbs", "mlx5_core", "mlx5_ib"),
    builtin: tuple[str, ...] = (),
    installed: dict[str, bytes] | None = None,
    modules_dep: bool = True,
    kallsyms: tuple[str, ...] | None = (
        "ib_register_client",
        "ib_register_peer_memory_client",  # a MOFED/DOCA ib_core
        "ib_umem_dmabuf_get",
    ),
    sig_enforce: bool = False,
    nvidia_taint: str = "PO",
    release: str = RELEASE,
    btf: tuple[str, ...] | None = None,
) -> FakeSysfs:
    """A GPU + RDMA node as rdmad.peermem reads it: the running kernel's release,
    /proc/modules and /sys/module (built-ins without initstate or holders), the
    module tree with modules.dep, /proc/kallsyms, signature enforcement, nvidia's taint.

    ``installed``: module path under /lib/modules/RELEASE -> file bytes (default: a
    signed nvidia-peermem that needs the peer-memory API). ``kallsyms`` None:
    unreadable (no such file). ``btf``: the function names in the BTF of ib_uverbs
    (/sys/kernel/btf/ib_uverbs when it is loaded, else vmlinux's); None: a kernel
    without BTF.
    """
    fs = FakeSysfs(root)
    fs.write("proc/sys/kernel/osrelease", release)
    for mod in loaded:
        fs.module(mod)
    for mod in builtin:
        fs.builtin_module(mod)
    fs.proc_modules(*loaded)
    if "nvidia" in loaded:
        fs.write("sys/module/nvidia/taint", nvidia_taint)
    fs.write("sys/module/module/parameters/sig_enforce", "Y" if sig_enforce else "N")
    files = (
        installed
        if installed is not None
        else {PEERMEM_KO: b"ib_register_peer_memory_client" + SIGNED}
    )
    base = f"lib/modules/{release}"
    (fs.root / base / "kernel").mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = fs.root / base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if modules_dep:
        deps = [f"{rel}: kernel/drivers/infiniband/core/ib_core.ko" for rel in files]
        deps.append("kernel/drivers/infiniband/core/ib_core.ko:")
        fs.write(f"{base}/modules.dep", "\n".join(deps))
    verbs_class = fs.root / "sys/class/infiniband_verbs"
    if "ib_uverbs" not in loaded and "ib_uverbs" not in builtin and verbs_class.is_dir():
        verbs_class.rmdir()  # ib_uverbs registers it: without the module, no such class
    if btf is not None:
        fs.btf("ib_uverbs" if "ib_uverbs" in loaded else "vmlinux", *btf)
    if kallsyms is not None:
        lines = [f"ffffffffc0{i:06x} T {s}\t[ib_core]" for i, s in enumerate(kallsyms)]
        fs.write("proc/kallsyms", "\n".join(["ffffffff81000000 T _stext", *lines]))
    return fs


# ------------------------------------------------------------------------------------------

MLX5_PF = "0000:3b:00.0"
MLX5_VFS = ("0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.4", "0000:3b:00.5")
IGB_PF = "0000:5e:00.0"
QEMU_PID = 4242


def mlx5_node(root: Path) -> FakeSysfs:
    """A node as it looks after someone set it up by hand (the demo tree).

    * mlx5 PF 0000:3b:00.0 (ConnectX, InfiniBand link layer) with 4 VFs:
      VF0 on mlx5_core with zero GUIDs, VF1 on vfio-pci held by a running QEMU
      (pid 4242), VF2 on mlx5_core, VF3 unbound.
    * igb PF 0000:5e:00.0 whose VFs were lost in a reboot (numvfs 0 of 7).
    * rdma_rxe loaded, no rxe link yet; eth0 a plain virtio NIC.
    """
    fs = FakeSysfs(root)
    fs.pf(MLX5_PF, "mlx5_core", totalvfs=8, numvfs=4)
    fs.pci("0000:3b:00.1", "mlx5_core")
    fs.netdev("ibp59s0", MLX5_PF, "00:00:10:49:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:2e:a6:70")
    fs.ib_device("mlx5_0", MLX5_PF, "b8:ce:f6:03:00:2e:a6:70", netdev="ibp59s0")
    drivers = ("mlx5_core", "vfio-pci", "mlx5_core", None)
    for i, (bdf, drv) in enumerate(zip(MLX5_VFS, drivers, strict=True)):
        fs.vf(MLX5_PF, i, bdf, drv, iommu_group=60 + i)
        fs.ib_vf(
            "mlx5_0", MLX5_PF, i, "00:00:00:00:00:00:00:00", "00:00:00:00:00:00:00:00", "Follow"
        )
        if drv == "mlx5_core":
            fs.ib_device(f"mlx5_{i + 2}", bdf, f"00:00:00:00:00:00:00:0{i}")
    fs.process(QEMU_PID, "qemu-system-x86", "/dev/vfio/61", "/dev/kvm")
    fs.process(1, "systemd", "/dev/null")
    fs.pf(IGB_PF, "igb", totalvfs=7, numvfs=0)
    fs.netdev("enp94s0f0", IGB_PF, "52:54:00:12:34:56")
    fs.pci("0000:00:03.0", "virtio-pci")
    fs.netdev("eth0", "0000:00:03.0", "52:54:00:ab:cd:ef")
    fs.netdev("lo", None, "00:00:00:00:00:00")
    for mod in ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "igb", "rdma_rxe", "vfio_pci"):
        fs.module(mod)
    return fs


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.support.fakesysfs DIR   (builds the demo node tree)")
    mlx5_node(Path(sys.argv[1]))
