"""A socket filter for the kernel's uevent socket: only the subsystems asked for wake it.

Why: a netdev appearing sends its own uevent and one per queue (a veth pair: both
ends), a driver reload hundreds, and each woke ``KernelUevents``' reader only for it to
drop them (0.3-1.8 ms of CPU per wake under emulation, spent just before the link news
the reflex waits for; bench/RESULTS.md). With this program attached, the kernel drops
them before they reach the socket.

Written by hand: classic BPF (``SO_ATTACH_FILTER``) assembled from a few opcodes.
libudev's filters read the header udevd puts on its own copies; the kernel's uevents
have no header, and no library builds a filter for them.

The kernel writes every uevent the same way (lib/kobject_uevent.c): ``ACTION@DEVPATH``,
then ``ACTION=``, ``DEVPATH=`` and ``SUBSYSTEM=`` first among its ``KEY=value``
strings, each NUL-terminated. So ``SUBSYSTEM=`` starts at ``2n + 17``, ``n`` the offset
of the first NUL. Classic BPF has no loops: the search for that NUL is unrolled over
the first ``SCAN`` bytes. The program is conservative: it drops a message only after
reading ``SUBSYSTEM=`` where the layout puts it followed by a subsystem not asked for.
A longer header or one laid out otherwise is let through; the reader's own parse still
decides.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Iterable

import msgspec

SO_ATTACH_FILTER = 26
SCAN = 256  # header bytes searched for its NUL: a devpath longer than ~250 is let through
KEY = b"SUBSYSTEM="
# SUBSYSTEM= starts at 2n + FIRST_KEYS: the header ACTION@DEVPATH\0 (n + 1 bytes),
# ACTION=...\0 (8 + len(ACTION)), DEVPATH=...\0 (9 + len(DEVPATH)), the two lengths n - 1.
FIRST_KEYS = 17
ACCEPT = 0xFFFF_FFFF  # keep the whole message
DROP = 0

# Opcodes (linux/filter.h: class | size | mode, or class | op | source).
LD_B_ABS = 0x30  # A = byte at k
LD_W_LEN = 0x80  # A = message length
LD_W_IND = 0x40  # A = 32-bit big-endian word at X + k
LD_H_IND = 0x48
LD_B_IND = 0x50
LDX_IMM = 0x01  # X = k
JEQ_K = 0x15  # A == k ? jt : jf
JGE_X = 0x3D  # A >= X ? jt : jf
JA = 0x05  # pc += k
SUB_K = 0x14  # A -= k
RET_K = 0x06

_LOAD = {4: LD_W_IND, 2: LD_H_IND, 1: LD_B_IND}


class Insn(msgspec.Struct, frozen=True):
    code: int
    jt: int = 0
    jf: int = 0
    k: int = 0

    def pack(self) -> bytes:
        return struct.pack("=HBBI", self.code, self.jt, self.jf, self.k)


def _chunks(text: bytes) -> list[tuple[int, int, int]]:
    """(offset, size, big-endian value) reads covering ``text``: words, then a half, a byte."""
    out: list[tuple[int, int, int]] = []
    offset = 0
    for size in (4, 2, 1):
        while len(text) - offset >= size:
            out.append((offset, size, int.from_bytes(text[offset : offset + size], "big")))
            offset += size
    return out


def _compare(text: bytes, at: int, miss: int) -> list[Insn]:
    """Instructions matching ``text`` at X + ``at``; a mismatch jumps ``miss`` instructions
    past the end of this block (0: to the instruction right after it)."""
    block: list[Insn] = []
    reads = _chunks(text)
    for i, (offset, size, value) in enumerate(reads):
        left = 2 * (len(reads) - i - 1)  # instructions after this read's jump
        block.append(Insn(_LOAD[size], k=at + offset))
        block.append(Insn(JEQ_K, 0, left + miss, value))
    return block


def _room(size: int, short: int) -> list[Insn]:
    """Has the message ``size`` bytes from X on (length - size >= X)? If not, jump
    ``short`` instructions past this block. A message shorter than ``size`` wraps to a
    large A and goes on, to a read out of bounds: dropped, being too short to hold it."""
    return [Insn(LD_W_LEN), Insn(SUB_K, k=size), Insn(JGE_X, 0, short, 0)]


def uevent_program(subsystems: Iterable[str]) -> list[Insn]:
    """The filter: keep a uevent of one of ``subsystems`` (and whatever it cannot read)."""
    values = [s.encode() + b"\0" for s in sorted(set(subsystems))]
    if not values:
        raise ValueError("a uevent filter needs at least one subsystem")
    common = 4 * SCAN + 1
    prog: list[Insn] = []
    for i in range(SCAN):  # the first NUL at i: X = where SUBSYSTEM= starts
        here = len(prog)
        prog += [
            Insn(LD_B_ABS, k=i),
            Insn(JEQ_K, 0, 2, 0),
            Insn(LDX_IMM, k=2 * i + FIRST_KEYS),
            Insn(JA, k=common - (here + 3) - 1),
        ]
    prog.append(Insn(RET_K, k=ACCEPT))  # no NUL within SCAN bytes
    assert len(prog) == common
    # SUBSYSTEM= where the layout puts it? If not (or no room for it), let it through.
    key = _compare(KEY, 0, 1)  # a mismatch: to the accept after the jump below
    prog += _room(len(KEY), len(key) + 1)
    prog += key
    prog.append(Insn(JA, k=1))
    prog.append(Insn(RET_K, k=ACCEPT))
    for value in values:  # each subsystem asked for, with its NUL: kept
        compare = _compare(value, len(KEY), 1)  # a mismatch skips the accept below
        prog += _room(len(KEY) + len(value), len(compare) + 1)
        prog += compare
        prog.append(Insn(RET_K, k=ACCEPT))
    prog.append(Insn(RET_K, k=DROP))
    if any(max(i.jt, i.jf) > 255 for i in prog):
        raise ValueError("uevent filter: a jump out of range")  # too many subsystems
    return prog


def attach_uevent_filter(sock: socket.socket, subsystems: Iterable[str]) -> None:
    """Attach ``uevent_program(subsystems)`` to ``sock``; OSError if the kernel refuses."""
    code = b"".join(i.pack() for i in uevent_program(subsystems))
    buf = ctypes.create_string_buffer(code, len(code))
    # struct sock_fprog: the count, then a pointer; the kernel copies the program.
    fprog = struct.pack("HP", len(code) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
