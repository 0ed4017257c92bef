"""A Sysfs that counts every primitive question put to it (read, read_bytes, listdir,
exists, stamp), by (method, path): what an observation asks the kernel, and how often.
Sysfs's composite reads (``sriov_pfs``, ``module_refcnt``...) go through these, and so
does ``OnceReads``, which asks the tree it wraps."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rdmad.kernel.sysfs import Sysfs


class CountingSysfs(Sysfs):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: Counter[tuple[str, str]] = Counter()

    def read(self, rel: str) -> str | None:
        self.asked[("read", rel)] += 1
        return super().read(rel)

    def read_bytes(self, rel: str) -> bytes | None:
        self.asked[("read_bytes", rel)] += 1
        return super().read_bytes(rel)

    def listdir(self, rel: str) -> list[str]:
        self.asked[("listdir", rel)] += 1
        return super().listdir(rel)

    def exists(self, rel: str) -> bool:
        self.asked[("exists", rel)] += 1
        return super().exists(rel)

    def stamp(self, rel: str) -> tuple[int, int] | None:
        self.asked[("stamp", rel)] += 1
        return super().stamp(rel)

    def twice(self) -> dict[tuple[str, str], int]:
        """The questions asked more than once."""
        return {k: n for k, n in self.asked.items() if n > 1}
