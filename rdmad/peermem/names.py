"""The peer-memory modules and what they need, by name: the kernel's spelling of a module
and the packages', the symbols that tell an RDMA stack apart, and the words for a kernel
that cannot load modules at all.

Its own module because every other part of ``rdmad.peermem`` (the facts, the findings,
the decision) and the code outside it (``rdmad.modsupport``, the kernel layer's modprobe,
the actions) names the same modules and must spell them the same way.
"""

from __future__ import annotations

GPU_DRIVER = "nvidia"
RDMA_CORE = "ib_core"
# In order of preference: a dGPU system has nvidia-peermem, an iGPU one nvidia-p2p.
CANDIDATES = ("nvidia_peermem", "nvidia_p2p")
PEER_API = "ib_register_peer_memory_client"
DMABUF_SYMBOL = "ib_umem_dmabuf_get"
# The module DMABUF_SYMBOL is linked into: the kernel's user-memory code (umem*.o) is
# part of ib_uverbs, not ib_core. Its class directory exists while it is loaded or
# built in (a built-in without parameters has no /sys/module entry).
DMABUF_MODULE = "ib_uverbs"
VERBS_CLASS = "sys/class/infiniband_verbs"
DMABUF_KERNEL = (5, 12)
# How the kernel layer appends the kernel log's lines to a failed modprobe's words.
KERNEL_LOG_SEP = "; kernel log: "
# Why no module can be loaded (rdmad.modsupport tells which applies, for every module).
MODULES_DISABLED = "module loading is disabled until reboot (/proc/sys/kernel/modules_disabled = 1)"
NO_MODULE_SUPPORT = "this kernel has no loadable module support (built without CONFIG_MODULES)"


def canonical(name: str) -> str:
    """The kernel's spelling of a module name (sysfs, /proc/modules): '-' becomes '_'."""
    return name.replace("-", "_")


def modprobe_name(name: str) -> str:
    """How the packages name the module (``modprobe nvidia-peermem``)."""
    return name.replace("_", "-")
