"""One exception for every kernel refusal, with the errno turned into words a user can act on."""

from __future__ import annotations

import errno as errno_mod
import os

# What an errno means for the kinds of writes rdmad does; os.strerror is the fallback.
_HINTS: dict[int, str] = {
    errno_mod.EBUSY: "device or resource busy",
    errno_mod.EINVAL: "invalid value for this device",
    errno_mod.ENOENT: "no such file or device",
    errno_mod.ENODEV: "no such device",
    errno_mod.EOPNOTSUPP: "operation not supported by the driver",
    errno_mod.EPROTONOSUPPORT: "protocol not supported by the driver",
    errno_mod.EPERM: "operation not permitted (not root, or locked down)",
    errno_mod.EACCES: "permission denied",
    errno_mod.ERANGE: "value out of range for this device",
    errno_mod.EEXIST: "already exists",
    errno_mod.ETIMEDOUT: "timed out",
}


class KernelError(Exception):
    """The kernel refused an operation. ``errno`` is None when no errno applies."""

    def __init__(self, op: str, target: str, errno: int | None, detail: str = "") -> None:
        self.op = op
        self.target = target
        self.errno = errno
        self.detail = detail
        super().__init__(str(self))

    @property
    def errno_name(self) -> str | None:
        if self.errno is None:
            return None
        if self.errno == errno_mod.EOPNOTSUPP:
            return "EOPNOTSUPP"  # errorcode says ENOTSUP, the same number on Linux
        return errno_mod.errorcode.get(self.errno)

    def __str__(self) -> str:
        what = f"{self.op} on {self.target}" if self.target else self.op
        if self.errno is None:
            return f"{what}: {self.detail}" if self.detail else what
        words = _HINTS.get(self.errno) or os.strerror(self.errno)
        # The strerror text a write passes along adds nothing to the words above.
        low = self.detail.lower()
        plain = low in words.lower() or low == os.strerror(self.errno).lower()
        extra = f"; {self.detail}" if self.detail and not plain else ""
        return f"{what}: {words} ({self.errno_name}){extra}"
