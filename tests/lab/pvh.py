"""The lab guest's kernel, uncompressed, for QEMU's PVH entry.

Debian's x86 kernel is an XZ-compressed bzImage: under TCG the guest spends ~7 s of
every boot and reboot in the firmware and the decompressor before the kernel prints
its first line (8.2 s to the banner against 1.3 s, measured in the lab). The same
kernel is built with CONFIG_PVH, so QEMU can load its ELF image (vmlinux) directly
and jump to the PVH entry point its ELF notes name: no real-mode setup, nothing to
decompress. This unpacks vmlinux once next to the image (standard library: the
payload is a plain XZ or gzip stream inside the bzImage) and checks for that
note, since QEMU refuses an ELF kernel without it; any other kernel boots as before.
"""

from __future__ import annotations

import lzma
import os
import struct
import zlib
from pathlib import Path

VMLINUX = "vmlinux"
ELF_MAGIC = b"\x7fELF"
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b\x08"
# The ELF note XEN_ELFNOTE_PHYS32_ENTRY (type 18) of owner "Xen": the PVH entry point.
# Its header is namesz (4, "Xen\0"), descsz (4 or 8), type; the name follows.
PVH_NOTES = tuple(struct.pack("<III", 4, size, 18) + b"Xen\x00" for size in (4, 8))
# Kernels found without a PVH entry in this process: each boot and reboot asks again,
# and finding "no" means decompressing the whole bzImage (~1.7 s on the host).
_COMPRESSED_ONLY: set[Path] = set()


def pvh_kernel(vmlinuz: Path) -> Path | None:
    """vmlinux beside ``vmlinuz``, unpacked on first use (written whole, then renamed);
    None when this kernel cannot be booted that way (the caller boots vmlinuz)."""
    target = vmlinuz.with_name(VMLINUX)
    if target.is_file():
        return target
    if vmlinuz in _COMPRESSED_ONLY:
        return None
    try:
        image = unpack(vmlinuz.read_bytes())
    except OSError:
        return None
    if image is None or not has_pvh_entry(image):
        _COMPRESSED_ONLY.add(vmlinuz)
        return None
    partial = target.with_name(f".{VMLINUX}.{os.getpid()}")
    try:
        partial.write_bytes(image)
        partial.replace(target)
    except OSError:
        partial.unlink(missing_ok=True)
        return None
    return target


def unpack(bzimage: bytes) -> bytes | None:
    """The ELF image inside a bzImage compressed with XZ or gzip; None otherwise."""
    for magic, decompress in ((XZ_MAGIC, _xz), (GZIP_MAGIC, _gzip)):
        at = bzimage.find(magic)
        if at < 0:
            continue
        try:
            image = decompress(bzimage[at:])
        except (lzma.LZMAError, zlib.error):
            continue
        if image.startswith(ELF_MAGIC):
            return image
    return None


def has_pvh_entry(image: bytes) -> bool:
    return any(note in image for note in PVH_NOTES)


def _xz(data: bytes) -> bytes:
    # One stream; what follows it in the bzImage (the setup's trailer) is left unread.
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)


def _gzip(data: bytes) -> bytes:
    # One gzip member; the rest of the bzImage after it is left unread.
    return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(data)
