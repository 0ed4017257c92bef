"""``rdmad-ctl doctor``: what stands between this node and RDMA / GPUDirect, read-only.

It loads, unloads and writes nothing, needs no daemon, no root and no tool (modprobe,
modinfo, ip, rdma, devlink): it reads /sys, /proc, /lib/modules and the kernel's build
config (/boot/config-RELEASE) directly, asks devlink itself for the eSwitch modes (the
one read that needs root) and says what it could not read and why. Standard library only
(and ``rdmad.peermem``, ``rdmad.modsupport``, ``rdmad.text`` and the daemon's pure
devlink codec, which are too), so rdmad-ctl stays fast and the doctor runs where rdmad's
own dependencies are broken.

* ``fs``: the read-only root, remembering what it was refused;
* ``checks``: one function per check (peermem, drivers, rxe, SR-IOV), with ``rdmadev``
  (the RDMA devices, and why there is none), ``iommu`` (the IOMMU mode), ``rdmasys``
  (the RDMA netns mode), ``eswitch`` (over ``devlink``) and ``openibd`` (whether
  openibd.service's stop asks the guard first) beside it;
* ``report``: the checks as a table and as JSON, and the exit code.
"""

from __future__ import annotations

from rdmad.doctor.checks import run_checks
from rdmad.doctor.fs import Root
from rdmad.doctor.report import Check, Report

__all__ = ["Check", "Report", "Root", "run_checks"]
