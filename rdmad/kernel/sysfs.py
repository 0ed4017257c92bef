"""Every sysfs and procfs read or write, relative to a root directory.

``Sysfs("/")`` is the real host; ``Sysfs(tmpdir)`` is a fake tree built by the
tests (tests/support/fakesysfs.py) or shipped for the demo. Nothing else in
rdmad opens a path under /sys or /proc directly.

Reads never raise for a missing file: the kernel removes directories under our
feet (VFs vanish on a driver unload), so a vanished file reads as None.
Writes raise ``KernelError`` with the errno the kernel gave.

What a safety decision rests on (who holds a VF, which VFs a PF has) is read with
``entries``/``read_known``/``link_known``/``present``: they raise ``Unreadable`` when
the kernel does not answer (EMFILE, EACCES, EIO...), so that a failed look reads as
"unknown" (= in use, the reason named), never as "nothing there".
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rdmad.kernel.errors import KernelError

PCI_DEVICES = "sys/bus/pci/devices"
# netdevsim devices are SR-IOV PFs that are not PCI functions (the lab's full-attribute
# PF): sriov_numvfs lives in their bus directory, there is no sriov_totalvfs (the limit
# is debugfs max_vfs) and their VFs are indexes, not devices.
NSIM_DEVICES = "sys/bus/netdevsim/devices"
NSIM_DEBUGFS = "sys/kernel/debug/netdevsim"
NSIM_DEFAULT_MAX_VFS = 4  # netdevsim's limit until debugfs max_vfs raises it
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# phys_port_name of a switchdev representor: pf0, pf0vf1, pf0sf3, c1pf0vf1 (mlx5, the
# kernel's devlink port naming); an uplink is p0/p1 or has no phys_port_name at all.
_REPRESENTOR_PORT = re.compile(r"^(c\d+)?pf\d+((vf|sf)\d+)?$")
CLASS_NET = "sys/class/net"
CLASS_IB = "sys/class/infiniband"


def _above_root(rel: str) -> bool:
    """Whether the ``..`` components of a relative path climb above its start."""
    depth = 0
    for part in rel.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


class Unreadable(Exception):
    """A listing or read that a safety decision rests on failed: the answer is unknown.

    ``reason`` names the path and the kernel's words ("cannot list /proc: Too many
    open files"); callers turn it into UNKNOWN usage, which counts as in use.
    """

    def __init__(self, verb: str, rel: str, exc: OSError) -> None:
        self.errno = exc.errno
        words = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
        self.reason = f"cannot {verb} /{rel.lstrip('/')}: {words}"
        super().__init__(self.reason)


@dataclass(frozen=True, slots=True)
class PciFunction:
    pci: str
    driver: str | None
    driver_override: str | None
    numvfs: int | None  # None: not SR-IOV capable
    totalvfs: int | None
    drivers_autoprobe: bool
    netdevs: tuple[str, ...]
    ib_devices: tuple[str, ...]
    iommu_group: str | None
    physfn: str | None
    # Reads of the above that failed (Unreadable reasons): who holds the function is
    # unknown, whatever the fields say.
    unreadable: tuple[str, ...] = ()


class Sysfs:
    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)
        self._prefix = str(root).rstrip("/")

    def path(self, rel: str) -> str:
        """``rel`` under the root; OSError(EINVAL) when its ``..`` lead above the root.

        Paths are built from config values and kernel names, and none may lead out of
        the root: an absolute name is taken as relative to the root, and ``..`` may
        only climb within it (``DEV/device/..``, a virtio NIC's PCI parent). Reads
        treat the error as "not there", writes report it as a KernelError.
        """
        # Plain string joins: pathlib's per-call parsing was the largest cost of an
        # observe() pass in the TCG guest (~40 %), and a pass does ~250 of these.
        rel = rel.lstrip("/")
        if ".." in rel and _above_root(rel):
            raise OSError(errno_mod.EINVAL, "path leads out of the sysfs root", rel)
        return f"{self._prefix}/{rel}"

    # --- primitive reads ------------------------------------------------------------

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel)) as fh:
                return fh.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            # Some attributes refuse reads (EINVAL/EOPNOTSUPP) on some drivers.
            if exc.errno in (
                errno_mod.EISDIR,
                errno_mod.EINVAL,
                errno_mod.EOPNOTSUPP,
                errno_mod.EIO,
                errno_mod.ENODEV,
                errno_mod.EACCES,
                errno_mod.EPERM,
            ):
                return None
            raise

    def read_bytes(self, rel: str) -> bytes | None:
        """A whole file as bytes (module files, /proc/kallsyms); None when unreadable."""
        try:
            with open(self.path(rel), "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def stamp(self, rel: str) -> tuple[int, int] | None:
        """(size, mtime in ns) of a file: tells a rewritten file (depmod, DKMS) apart."""
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    def open_kernel_log(self, *, at_end: bool = False) -> int | None:
        """An fd on /dev/kmsg that never blocks; ``at_end``: only records written from now.

        O_NONBLOCK makes a read stop with EAGAIN at the end of the buffer instead of
        waiting for new records. None when unreadable (no CAP_SYSLOG, no /dev/kmsg).
        A fake tree's dev/kmsg is a plain file of records.
        """
        try:
            fd = os.open(self.path("dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        if at_end:
            try:
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                os.close(fd)
                return None
        return fd

    @staticmethod
    def read_kernel_log(fd: int, limit: int = 20000) -> list[str]:
        """Records from an ``open_kernel_log`` fd up to now, and close it.

        EPIPE says records were overwritten while reading: skip on.
        """
        lines: list[str] = []
        try:
            for _ in range(limit):
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno_mod.EPIPE:
                        continue
                    break
                if not chunk:
                    break
                lines.extend(chunk.decode(errors="replace").splitlines())
        finally:
            os.close(fd)
        return lines

    def read_int(self, rel: str) -> int | None:
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text, 0)
        except ValueError:
            return None

    def link_name(self, rel: str) -> str | None:
        """Basename of a symlink's target (e.g. the driver a device is bound to)."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        """A directory's names; [] when it cannot be listed, for reads where that is
        harmless. What a safety decision rests on uses ``entries``."""
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError:
            return []

    # --- reads a safety decision rests on: a failure is Unreadable, never "nothing" ---------

    def entries(self, rel: str, *, optional: bool = False) -> list[str]:
        """A directory's names, or Unreadable: EMFILE, EACCES, EIO... never read as [].

        ``optional``: the directory's absence (ENOENT) means there is nothing of its
        kind (no libvirt, no ib_uverbs loaded, a VF without a netdev); otherwise a
        missing directory is as unknown as an unreadable one.
        """
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError as exc:
            if optional:
                return []
            raise Unreadable("list", rel, exc) from None
        except OSError as exc:
            raise Unreadable("list", rel, exc) from None

    def read_known(self, rel: str) -> str | None:
        """A file's text; None when it is not there (ENOENT); any other error Unreadable."""
        try:
            with open(self.path(rel)) as fh:
                return fh.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise Unreadable("read", rel, exc) from None

    def link_known(self, rel: str) -> str | None:
        """Basename of a symlink's target; None when there is no such link (ENOENT); any
        other error (including a file that is not a link) Unreadable."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise Unreadable("read the link", rel, exc) from None

    def present(self, rel: str) -> bool:
        """Whether a path exists; a failed lstat other than ENOENT is Unreadable (where
        ``exists`` would say False: "gone", so "free")."""
        try:
            os.lstat(self.path(rel))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise Unreadable("look up", rel, exc) from None
        return True

    def exists(self, rel: str) -> bool:
        try:
            return os.path.lexists(self.path(rel))
        except OSError:
            return False

    # --- writes ----------------------------------------------------------------------

    def write(self, rel: str, value: str, *, op: str | None = None) -> None:
        """Write one value the way `echo value > file` does, raising the kernel's errno.

        Opened without O_CREAT: writing to an attribute that does not exist is
        an error (ENOENT), never a new file. O_TRUNC as the shell's `>` does: the
        kernel ignores it, and a fake tree then holds exactly the value written.
        """
        try:
            fd = os.open(self.path(rel), os.O_WRONLY | os.O_TRUNC)
        except OSError as exc:
            raise KernelError(op or "write", str(rel), exc.errno, exc.strerror or "") from exc
        try:
            # The kernel's answer for a sysfs store comes from write(), so it must
            # be checked here, not left to a close() nobody looks at.
            os.write(fd, value.encode())
        except OSError as exc:
            raise KernelError(
                op or f"write {value!r}", str(rel), exc.errno, exc.strerror or ""
            ) from exc
        finally:
            os.close(fd)

    # --- PCI ---------------------------------------------------------------------------

    def pci_addresses(self) -> list[str]:
        return self.listdir(PCI_DEVICES)

    @staticmethod
    def is_netdevsim(dev: str) -> bool:
        return dev.startswith("netdevsim")

    def device_dir(self, dev: str) -> str:
        """sysfs directory of a PF: a PCI address, or a netdevsim device name."""
        return f"{NSIM_DEVICES}/{dev}" if self.is_netdevsim(dev) else f"{PCI_DEVICES}/{dev}"

    def pci_function(self, pci: str) -> PciFunction | None:
        base = self.device_dir(pci)
        if not self.exists(base):
            return None
        # What decides who can hold the function (its driver, its iommu group, its
        # netdevs and RDMA devices): a failed read is remembered, not taken as "none".
        unreadable: list[str] = []

        def entries(rel: str) -> tuple[str, ...]:
            try:
                # No net/ or infiniband/ directory: no netdev or RDMA device.
                return tuple(self.entries(rel, optional=True))
            except Unreadable as exc:
                unreadable.append(exc.reason)
                return ()

        def link(rel: str) -> str | None:
            try:
                return self.link_known(rel)
            except Unreadable as exc:
                unreadable.append(exc.reason)
                return None

        override = self.read(f"{base}/driver_override")
        physfn = self.link_name(f"{base}/physfn")
        # A VF has no SR-IOV capability, so no sriov_* files: not opening them is
        # 3 of a VF's ~8 opens, and observe() reads every VF twice per pass.
        autoprobe = numvfs = totalvfs = None
        if physfn is None:
            autoprobe = self.read_int(f"{base}/sriov_drivers_autoprobe")
            numvfs = self.read_int(f"{base}/sriov_numvfs")
            totalvfs = self.read_int(f"{base}/sriov_totalvfs")
        if totalvfs is None and self.is_netdevsim(pci) and self.exists(f"{base}/sriov_numvfs"):
            totalvfs = self.read_int(f"{NSIM_DEBUGFS}/{pci}/max_vfs") or NSIM_DEFAULT_MAX_VFS
        return PciFunction(
            pci=pci,
            driver=link(f"{base}/driver"),
            driver_override=None if override in (None, "(null)", "") else override,
            numvfs=numvfs,
            totalvfs=totalvfs,
            drivers_autoprobe=autoprobe != 0,
            netdevs=entries(f"{base}/net"),
            ib_devices=entries(f"{base}/infiniband"),
            iommu_group=link(f"{base}/iommu_group"),
            physfn=physfn,
            unreadable=tuple(unreadable),
        )

    def sriov_pfs(self) -> list[str]:
        """PCI functions that can have VFs, then netdevsim devices (named netdevsimN)."""
        pci = [p for p in self.pci_addresses() if self.exists(f"{PCI_DEVICES}/{p}/sriov_totalvfs")]
        nsim = [
            d
            for d in self.listdir(NSIM_DEVICES)
            if self.is_netdevsim(d) and self.exists(f"{NSIM_DEVICES}/{d}/sriov_numvfs")
        ]
        return pci + nsim

    def virtfns(self, pci: str) -> dict[int, str]:
        """VF index -> VF PCI address, from the PF's virtfnN links; Unreadable when they
        cannot be listed (the VFs a write would destroy are then unknown, not none).

        A PF that is gone has no VFs; a virtfn link that vanished is a VF removed meanwhile.
        """
        out: dict[int, str] = {}
        base = f"{PCI_DEVICES}/{pci}"
        for entry in self.entries(base, optional=True):
            if entry.startswith("virtfn") and entry[6:].isdigit():
                target = self.link_known(f"{base}/{entry}")
                if target:
                    out[int(entry[6:])] = target
        return out

    # --- network devices ---------------------------------------------------------------

    def netdevs(self) -> list[str]:
        return self.listdir(CLASS_NET)

    def netdev_attr(self, name: str, attr: str) -> str | None:
        return self.read(f"{CLASS_NET}/{name}/{attr}")

    def own_netdev(self, names: Sequence[str]) -> str | None:
        """The netdev that stands for a PCI function itself, among those under its net/.

        A function can carry several netdevs: a switchdev PF also carries its VF and
        PF representors (phys_port_name pfNvfM, pfN, pfNsfM, cCpfN...), and mlx4 puts
        both ports of a card on one function (dev_port 0 and 1). The function's own
        netdev is the one that is not a representor, lowest dev_port first, then by
        name so the choice is stable. None when there is none.
        """
        candidates = []
        for name in names:
            port_name = self.netdev_attr(name, "phys_port_name")
            if port_name and _REPRESENTOR_PORT.match(port_name):
                continue
            dev_port = self.read_int(f"{CLASS_NET}/{name}/dev_port") or 0
            candidates.append((dev_port, name))
        return min(candidates)[1] if candidates else None

    def netdev_pci(self, name: str) -> str | None:
        """The PCI function behind a netdev; None for virtual devices.

        A virtio NIC's device is a virtio bus device (virtioN) whose parent is
        the PCI function lspci shows; that is the address operators know.
        """
        device = f"{CLASS_NET}/{name}/device"
        subsystem = self.link_name(f"{device}/subsystem")
        if subsystem == "virtio":
            device = f"{device}/.."
            subsystem = self.link_name(f"{device}/subsystem")
        if subsystem not in (None, "pci"):
            return None
        try:
            if device.endswith("/.."):
                target = os.path.basename(os.path.realpath(self.path(device)))
            else:
                # The device link points at the function's directory, whose name is
                # its address: one readlink, where realpath() lstat()s every component
                # (a quarter of an observe() pass over many VFs).
                target = os.path.basename(os.readlink(self.path(device)))
        except OSError:
            return None
        return target if _PCI_ADDRESS.match(target) else None

    # --- InfiniBand ----------------------------------------------------------------------

    def ib_devices(self) -> list[str]:
        return self.listdir(CLASS_IB)

    def ib_attr(self, dev: str, attr: str) -> str | None:
        return self.read(f"{CLASS_IB}/{dev}/{attr}")

    def ib_port_netdevs(self, dev: str, port: int = 1) -> list[str]:
        base = f"{CLASS_IB}/{dev}/ports/{port}/gid_attrs/ndevs"
        names = {self.read(f"{base}/{n}") for n in self.listdir(base)}
        return sorted(n for n in names if n)

    def ib_gids(self, dev: str, port: int = 1, limit: int = 32) -> tuple[str, ...] | None:
        """The valid GIDs among the first ``limit`` entries of a port's table; None when
        the table cannot be read. ib_core puts a new GID at the lowest free index, so
        the first entries hold every GID unless many were deleted and none added since
        (rxe's table has 1,024 entries: reading them all on every pass is not cheap)."""
        base = f"{CLASS_IB}/{dev}/ports/{port}/gids"
        out = []
        for index in range(limit):
            gid = self.read(f"{base}/{index}")
            if gid is None:
                if index == 0:
                    return None
                break  # a shorter table
            if gid.replace("0", "").replace(":", ""):  # the kernel prints a free entry as 0s
                out.append(gid)
        return tuple(out)

    def ib_port_state(self, dev: str, port: int = 1) -> str | None:
        """Port state as sysfs prints it ("4: ACTIVE" -> "ACTIVE"); None when unreadable."""
        text = self.read(f"{CLASS_IB}/{dev}/ports/{port}/state")
        if text is None:
            return None
        return text.partition(":")[2].strip() or None

    def ib_driver(self, dev: str) -> str | None:
        """Kernel driver of an RDMA device: the PCI driver, or 'rxe' for Soft-RoCE."""
        driver = self.link_name(f"{CLASS_IB}/{dev}/device/driver")
        if driver is not None:
            return driver
        # rxe has no parent PCI device; it exposes the netdev it sits on as 'parent'.
        if self.read(f"{CLASS_IB}/{dev}/parent") is not None:
            return "rxe"
        return None

    def ib_vf_dir(self, dev: str, vf: int) -> str:
        return f"{CLASS_IB}/{dev}/device/sriov/{vf}"

    def ib_vf(self, dev: str, vf: int) -> dict[str, str | None] | None:
        base = self.ib_vf_dir(dev, vf)
        if not self.exists(base):
            return None
        return {
            "node_guid": self.read(f"{base}/node"),
            "port_guid": self.read(f"{base}/port"),
            "policy": self.read(f"{base}/policy"),
        }

    # --- modules and kernel switches -------------------------------------------------------

    def loaded_modules(self) -> frozenset[str]:
        """Modules that are loaded (built-ins have no initstate and are not listed)."""
        return frozenset(
            m
            for m in self.listdir("sys/module")
            if self.read(f"sys/module/{m}/initstate") == "live"
        )

    def module_holders(self, module: str) -> list[str]:
        return self.listdir(f"sys/module/{module}/holders")

    def module_refcnt(self, module: str) -> int | None:
        return self.read_int(f"sys/module/{module}/refcnt")

    def module_params(self, module: str) -> dict[str, str | None]:
        base = f"sys/module/{module}/parameters"
        return {p: self.read(f"{base}/{p}") for p in self.listdir(base)}

    def modules_disabled(self) -> bool:
        return self.read_int("proc/sys/kernel/modules_disabled") == 1

    def cmdline(self) -> str:
        return self.read("proc/cmdline") or ""

    def vfio_cdevs(self, pci: str) -> list[str]:
        """/dev/vfio/devices/vfioN nodes of a device bound to vfio-pci (iommufd's cdev);
        Unreadable when they cannot be listed. No vfio-dev/ directory: no cdev (a kernel
        without iommufd's cdev, or the device not on vfio-pci)."""
        rel = f"{PCI_DEVICES}/{pci}/vfio-dev"
        return [f"/dev/vfio/devices/{n}" for n in self.entries(rel, optional=True)]

    def iommu_group_type(self, group: str) -> str | None:
        return self.read(f"sys/kernel/iommu_groups/{group}/type")

    # --- processes (for usage) -------------------------------------------------------------

    def pids(self) -> list[str]:
        """Every process; Unreadable when /proc cannot be listed (EMFILE under a flood of
        connections, a missing /proc): then nobody's open files are known."""
        return [entry for entry in self.entries("proc") if entry.isdigit()]

    def comm(self, pid: str) -> str:
        """A process's name, for messages only: "?" when it cannot be read."""
        try:
            return self.read(f"proc/{pid}/comm") or "?"
        except OSError:
            return "?"

    def netns_id(self, rel: str) -> tuple[int, int] | None:
        """(device, inode) naming the network namespace a file stands for, e.g.
        ``proc/PID/ns/net`` or ``run/netns/NAME``; None when it cannot be read."""
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return None
        return (st.st_dev, st.st_ino)
