"""The doctor's view of a host: files relative to a root, read-only, and a record of
what it could not read (permission denied is worth saying; absent files usually not).

The daemon reads through ``rdmad.kernel.sysfs.Sysfs``; the doctor cannot import the
kernel package (rdmad-ctl must start fast) and needs to tell "absent" from "refused",
which Sysfs folds together. It offers the same ``read``/``listdir``/``exists``/
``read_bytes`` that ``rdmad.peermem.facts.Reader`` asks for.
"""

from __future__ import annotations

import errno
import os

_ABSENT = (errno.ENOENT, errno.ENOTDIR)


class Root:
    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._prefix = root.rstrip("/")
        self.refused: dict[str, str] = {}  # "/path" -> why (strerror)

    def path(self, rel: str) -> str:
        return f"{self._prefix}/{rel.lstrip('/')}"

    def _note(self, rel: str, exc: OSError) -> None:
        if exc.errno not in _ABSENT and exc.errno not in (errno.EINVAL, errno.EISDIR):
            self.refused.setdefault(f"/{rel.lstrip('/')}", exc.strerror or str(exc))

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel), errors="replace") as fh:
                return fh.read().strip()
        except OSError as exc:
            self._note(rel, exc)
            return None

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with open(self.path(rel), "rb") as fh:
                return fh.read()
        except OSError as exc:
            self._note(rel, exc)
            return None

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError as exc:
            self._note(rel, exc)
            return []

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.path(rel))

    def lookup(self, rel: str) -> bool | None:
        """Whether a path exists; None (and noted) when the lookup fails otherwise."""
        try:
            os.lstat(self.path(rel))
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            self._note(rel, exc)
            return None
        return True

    def link_name(self, rel: str) -> str | None:
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except OSError:
            return None

    def kernel_log(self, limit: int = 20000) -> list[str] | None:
        """The kernel log's records, read without blocking (O_NONBLOCK: EAGAIN at the
        end instead of waiting); None when it cannot be read (dmesg_restrict, no root)."""
        try:
            fd = os.open(self.path("dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self._note("dev/kmsg", exc)
            return None
        lines: list[str] = []
        try:
            for _ in range(limit):
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten while reading: go on
                        continue
                    self._note("dev/kmsg", exc)
                    return None
                if not chunk:
                    break
                lines.extend(chunk.decode(errors="replace").splitlines())
        finally:
            os.close(fd)
        return lines
