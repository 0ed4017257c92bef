"""Files under a root: the reads, the reads a safety decision rests on, and the write.

Every path is relative to a root: ``Sysfs("/")`` is the real host, ``Sysfs(tmpdir)`` a
fake tree built by the tests (tests/support/fakesysfs.py) or shipped for the demo.
Nothing else in rdmad opens a path under /sys or /proc directly. ``Sysfs``
(``kernel.sysfs``, a subclass) knows which of these files says what.

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
from pathlib import Path

from rdmad.kernel.errors import KernelError


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


class SysfsFiles:
    """Paths under ``root``, read and written as the module says."""

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
