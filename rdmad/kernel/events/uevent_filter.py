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
the first ``SCAN`` bytes, a word at a time (whether a word holds a zero byte is a few
arithmetic instructions), then the byte within the word that holds it. The program is
conservative: it drops a message only after reading ``SUBSYSTEM=`` where the layout
puts it followed by a subsystem not asked for. A longer header or one laid out
otherwise is let through; the reader's own parse still decides.

Its size matters: the kernel converts the program to eBPF (each load becomes ~14
instructions) and charges it to the socket's option memory, which
``net.core.optmem_max`` bounds: 20 KiB by default up to Linux 6.8 (Debian 12, Ubuntu
22.04, RHEL 8 and 9), 128 KiB after. Unrolled a byte at a time the search made ~4,000
eBPF instructions, 32 KiB: refused there with ENOMEM, so every uevent woke the reader.
A word at a time it is ~1,700 (14 KiB). Where a node's limit is lower still, a shorter
search is tried (``SCANS``).
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
from collections.abc import Iterable

import msgspec

SO_ATTACH_FILTER = 26
SCAN = 256  # header bytes searched for its NUL: a devpath longer than ~250 is let through
# Tried in turn where the kernel has too little option memory for the longer one.
SCANS = (SCAN, 128, 64)
KEY = b"SUBSYSTEM="
# SUBSYSTEM= starts at 2n + FIRST_KEYS: the header ACTION@DEVPATH\0 (n + 1 bytes),
# ACTION=...\0 (8 + len(ACTION)), DEVPATH=...\0 (9 + len(DEVPATH)), the two lengths n - 1.
FIRST_KEYS = 17
ACCEPT = 0xFFFF_FFFF  # keep the whole message
DROP = 0

# Opcodes (linux/filter.h: class | size | mode, or class | op | source).
LD_W_ABS = 0x20  # A = 32-bit big-endian word at k
LD_MEM = 0x60  # A = M[k]
ST = 0x02  # M[k] = A
TAX = 0x07  # X = A
TXA = 0x87  # A = X
ADD_K = 0x04
MUL_K = 0x24
AND_K = 0x54
AND_X = 0x5C
XOR_K = 0xA4
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
ONES = 0x0101_0101
HIGHS = 0x8080_8080  # (w - ONES) & ~w & HIGHS is nonzero exactly when w has a zero byte

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


def _first_nul(scan: int) -> list[Insn]:
    """Find the first NUL within ``scan`` bytes (a multiple of 4): falls through with X =
    where ``SUBSYSTEM=`` starts, or accepts the message (no NUL in that span)."""
    per_word = 11
    find = per_word * (scan // 4) + 1  # where the byte search starts
    prog: list[Insn] = []
    for at in range(0, scan, 4):
        here = len(prog)
        prog += [
            Insn(LD_W_ABS, k=at),
            Insn(ST, k=0),
            Insn(SUB_K, k=ONES),
            Insn(TAX),
            Insn(LD_MEM, k=0),
            Insn(XOR_K, k=0xFFFF_FFFF),
            Insn(AND_X),
            Insn(AND_K, k=HIGHS),
            Insn(JEQ_K, 2, 0, 0),  # no zero byte in it: the next word
            Insn(LDX_IMM, k=at),
            Insn(JA, k=find - (here + per_word)),
        ]
    prog.append(Insn(RET_K, k=ACCEPT))  # no NUL within the span
    assert len(prog) == find
    # X = the offset of the word that holds it: which of its bytes is the first zero
    # (A = X + that byte's place; none of the first three: the fourth).
    per_byte = 5
    for place in range(3):
        prog += [
            Insn(LD_B_IND, k=place),
            Insn(JEQ_K, 0, 3, 0),  # not zero: the next byte
            Insn(TXA),
            Insn(ADD_K, k=place),
            Insn(JA, k=per_byte * (2 - place) + 2),  # past the fourth's two
        ]
    prog += [Insn(TXA), Insn(ADD_K, k=3)]
    # The NUL's offset n -> X = 2n + FIRST_KEYS.
    prog += [Insn(MUL_K, k=2), Insn(ADD_K, k=FIRST_KEYS), Insn(TAX)]
    return prog


def uevent_program(subsystems: Iterable[str], scan: int = SCAN) -> list[Insn]:
    """The filter: keep a uevent of one of ``subsystems`` (and whatever it cannot read),
    searching the first ``scan`` bytes for the header's end."""
    values = [s.encode() + b"\0" for s in sorted(set(subsystems))]
    if not values:
        raise ValueError("a uevent filter needs at least one subsystem")
    if scan <= 0 or scan % 4:
        raise ValueError(f"uevent filter: a search span of {scan} is not a multiple of 4")
    prog = _first_nul(scan)
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


def attach_uevent_filter(sock: socket.socket, subsystems: Iterable[str]) -> int:
    """Attach ``uevent_program(subsystems)`` to ``sock`` with the longest search span of
    ``SCANS`` that the socket's option memory takes; returns that span. OSError if the
    kernel refuses the shortest too, or refuses for another reason."""
    wanted = tuple(subsystems)
    for scan in SCANS[:-1]:
        try:
            _attach(sock, uevent_program(wanted, scan))
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            continue
        return scan
    _attach(sock, uevent_program(wanted, SCANS[-1]))
    return SCANS[-1]


def _attach(sock: socket.socket, prog: list[Insn]) -> None:
    code = b"".join(i.pack() for i in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    # struct sock_fprog: the count, then a pointer; the kernel copies the program.
    fprog = struct.pack("HP", len(code) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
