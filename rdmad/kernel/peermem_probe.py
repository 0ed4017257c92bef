"""The peer-memory facts of one observation, read through ``Sysfs``.

``rdmad.peermem.gather`` knows which files matter; this keeps the daemon from paying
for the expensive ones (modules.dep, module files, /proc/kallsyms: megabytes under
TCG) on every pass: they are read only while a GPU driver is loaded, and again only
when something they depend on changed (the loaded modules, the kernel switches,
modules.dep rewritten by depmod after a DKMS build).
"""

from __future__ import annotations

from rdmad import peermem
from rdmad.kernel.sysfs import Sysfs


class PeermemProbe:
    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._facts: peermem.PeermemFacts | None = None

    def facts(self, sysfs: Sysfs) -> peermem.PeermemFacts:
        cheap = peermem.gather(sysfs, full=False)
        if peermem.GPU_DRIVER not in cheap.loaded:
            return cheap  # no GPU driver: peermem is not needed, whatever is installed
        dep = f"lib/modules/{cheap.release}/modules.dep" if cheap.release else ""
        key = (
            cheap.release,
            cheap.loaded,
            cheap.loading_disabled,
            cheap.sig_enforce,
            sysfs.stamp(dep) if dep else None,
        )
        if key != self._key or self._facts is None:
            self._facts = peermem.gather(sysfs, full=True)
            self._key = key
        return self._facts
