"""The peer-memory facts of one observation, read through ``Sysfs``.

``rdmad.peermem.gather`` knows which files matter; this keeps the daemon from paying
for the expensive ones (modules.dep, module files, /proc/kallsyms: megabytes under
TCG) on every pass: they are read only where the declared mode's decision can turn on
them (``rdmad.peermem.choice.needs_all_facts``: a GPU driver loaded, and for auto the
RDMA core too), and again only when something they depend on changed (the loaded
modules, the kernel switches, modules.dep rewritten by depmod after a DKMS build). Of
those, /proc/kallsyms (which the kernel formats as it is read: tens of ms on a real
node) only where a finding can turn on what ib_core exports (``gather``'s
``all_symbols``).
"""

from __future__ import annotations

from rdmad import peermem
from rdmad.kernel.sysfs import Sysfs
from rdmad.peermem.choice import Mode, needs_all_facts


class PeermemProbe:
    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._facts: peermem.PeermemFacts | None = None

    def facts(self, sysfs: Sysfs, mode: Mode = "require") -> peermem.PeermemFacts:
        """The facts the decision for ``mode`` can turn on: the cheap ones only where
        the rest cannot change it (off; no GPU driver; auto without the RDMA core)."""
        cheap = peermem.gather(sysfs, full=False)
        if not needs_all_facts(mode, cheap.loaded):
            return cheap
        dep = f"lib/modules/{cheap.release}/modules.dep" if cheap.release else ""
        key = (
            cheap.release,
            cheap.loaded,
            cheap.loading_disabled,
            cheap.sig_enforce,
            sysfs.stamp(dep) if dep else None,
        )
        if key != self._key or self._facts is None:
            self._facts = peermem.gather(sysfs, full=True, all_symbols=False)
            self._key = key
        return self._facts
