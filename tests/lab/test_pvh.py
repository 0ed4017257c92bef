"""pvh.py unpacks the guest kernel's ELF image for QEMU's PVH entry (host-side: no guest)."""

from __future__ import annotations

import lzma
import zlib
from pathlib import Path

from pvh import PVH_NOTES, pvh_kernel, unpack

ELF = b"\x7fELF" + b"\0" * 60 + PVH_NOTES[1] + b"\x50\x08\x00\x01\0\0\0\0" + b"\0" * 4000
SETUP = b"MZ setup code \x00" * 100  # what precedes the payload in a bzImage
TRAILER = b"\x00\x11\x22 trailer"


def _gzip(data: bytes) -> bytes:
    z = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


def test_an_xz_bzimage_gives_its_elf_image_once_and_then_the_file(tmp_path: Path) -> None:
    vmlinuz = tmp_path / "vmlinuz"
    vmlinuz.write_bytes(SETUP + lzma.compress(ELF, format=lzma.FORMAT_XZ) + TRAILER)
    got = pvh_kernel(vmlinuz)
    assert got == tmp_path / "vmlinux"
    assert got.read_bytes() == ELF
    vmlinuz.write_bytes(b"no longer a kernel")  # the unpacked file is used from now on
    assert pvh_kernel(vmlinuz) == got
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vmlinux", "vmlinuz"]


def test_a_gzip_payload_is_read_too() -> None:
    assert unpack(SETUP + _gzip(ELF) + TRAILER) == ELF


def test_a_kernel_without_the_pvh_note_boots_compressed(tmp_path: Path) -> None:
    vmlinuz = tmp_path / "vmlinuz"
    no_note = b"\x7fELF" + b"\0" * 5000
    vmlinuz.write_bytes(SETUP + lzma.compress(no_note, format=lzma.FORMAT_XZ))
    assert pvh_kernel(vmlinuz) is None
    assert not (tmp_path / "vmlinux").exists()
    # The answer is kept: the next boot does not decompress the kernel again to learn it.
    vmlinuz.write_bytes(SETUP + lzma.compress(ELF, format=lzma.FORMAT_XZ))
    assert pvh_kernel(vmlinuz) is None


def test_an_unknown_or_broken_payload_gives_none(tmp_path: Path) -> None:
    assert unpack(SETUP + TRAILER) is None
    assert unpack(SETUP + b"\xfd7zXZ\x00 not really xz") is None
    assert unpack(SETUP + lzma.compress(b"not an ELF", format=lzma.FORMAT_XZ)) is None
    assert pvh_kernel(tmp_path / "missing") is None
