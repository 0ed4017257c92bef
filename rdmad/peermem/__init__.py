"""GPUDirect peer memory: which module applies, when to load it, and why it cannot load.

Pure and standard-library only, because two very different programs decide with it:
the daemon's planner (``rdmad.reconcile.peermem``) and ``rdmad-ctl doctor``
(``rdmad.doctor``, which must start fast and never pull the config schema). Both must say the
same thing in the same words about the same node.

* ``names``: the modules and symbols by name, the kernel's spelling and the packages';
* ``facts``: ``gather()`` reads ``PeermemFacts`` through a ``Reader`` it is given (nothing
  here opens a file: the kernel layer's ``Sysfs(root)`` in the daemon, the doctor's
  read-only root in rdmad-ctl, fake trees in tests);
* ``findings``: why loading cannot work, before a modprobe (``preflight``) and after a
  failed one (``diagnose``), and when DMA-BUF makes peermem unnecessary;
* ``choice``: ``decide()``, from the mode, the facts and a remembered lasting failure.

The facts (seeds 002, FIELD.md): ``nvidia-peermem`` (dGPU) or ``nvidia-p2p``
(Jetson/IGX iGPU) needs the GPU driver (``nvidia``) and the RDMA core (``ib_core``)
loaded first; it needs an ``ib_core`` that exports ``ib_register_peer_memory_client``
(MOFED/DOCA; inbox kernels do not), built in the right order (MOFED before the GPU
driver's DKMS modules, else "disagrees about version of symbol"). DMA-BUF (kernel
>= 5.12 with ``ib_umem_dmabuf_get``, open GPU kernel modules) needs no peermem at all.

The names below are the package's entry for the daemon's kernel layer and agent (what
to read, how to spell a module, what a failed load means, what is remembered of it);
everything else imports from the module that holds it.
"""

from __future__ import annotations

from rdmad.peermem.choice import Held
from rdmad.peermem.facts import PeermemFacts, gather
from rdmad.peermem.findings import diagnose
from rdmad.peermem.names import GPU_DRIVER, KERNEL_LOG_SEP, canonical

__all__ = [
    "GPU_DRIVER",
    "KERNEL_LOG_SEP",
    "Held",
    "PeermemFacts",
    "canonical",
    "diagnose",
    "gather",
]
