"""rdmad.kernel.events.uevent_filter: the program, run by a small classic-BPF interpreter.

The interpreter follows the kernel's rules for the opcodes the program uses (a read
past the message's end ends the program with 0: drop). tests/kernel/test_uevents.py
runs the same program in the kernel.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmad.kernel.events import uevent_filter as uf
from rdmad.kernel.events.uevents import parse_uevent

RDMA = ("infiniband", "infiniband_verbs")
WANTED = {s: frozenset({"add", "remove", "move", "change", "bind"}) for s in RDMA}


def run(prog: list[uf.Insn], data: bytes) -> int:
    """The verdict of ``prog`` on ``data`` (bytes kept; 0: dropped)."""
    a = x = pc = 0
    mem = [0] * 16
    alu = {
        uf.ADD_K: lambda a, k: a + k,
        uf.SUB_K: lambda a, k: a - k,
        uf.MUL_K: lambda a, k: a * k,
        uf.AND_K: lambda a, k: a & k,
        uf.XOR_K: lambda a, k: a ^ k,
    }
    for _ in range(len(prog)):  # forward jumps only: every instruction at most once
        i = prog[pc]
        pc += 1
        if i.code == uf.RET_K:
            return i.k
        if i.code in (uf.LD_W_ABS, uf.LD_W_IND, uf.LD_H_IND, uf.LD_B_IND):
            at = i.k if i.code == uf.LD_W_ABS else x + i.k
            size = {uf.LD_W_ABS: 4, uf.LD_W_IND: 4, uf.LD_H_IND: 2}.get(i.code, 1)
            if at + size > len(data):
                return 0  # the kernel's rule for a read out of bounds
            a = int.from_bytes(data[at : at + size], "big")
        elif i.code == uf.LD_W_LEN:
            a = len(data)
        elif i.code == uf.LD_MEM:
            a = mem[i.k]
        elif i.code == uf.ST:
            mem[i.k] = a
        elif i.code == uf.LDX_IMM:
            x = i.k
        elif i.code == uf.TAX:
            x = a
        elif i.code == uf.TXA:
            a = x
        elif i.code in alu:
            a = alu[i.code](a, i.k) & 0xFFFF_FFFF  # 32-bit arithmetic
        elif i.code == uf.AND_X:
            a &= x
        elif i.code == uf.JEQ_K:
            pc += i.jt if a == i.k else i.jf
        elif i.code == uf.JGE_X:
            pc += i.jt if a >= x else i.jf
        elif i.code == uf.JA:
            pc += i.k
        else:
            raise AssertionError(f"opcode {i.code:#x} not in the interpreter")
    raise AssertionError("ran off the end of the program")


def ebpf_size(prog: list[uf.Insn]) -> int:
    """Bytes the kernel charges to the socket for ``prog`` converted to eBPF
    (net/core/filter.c, bpf_convert_filter: a packet load becomes up to 14 instructions,
    the rest one each; bpf_prog_size adds the program's header, ~72 bytes)."""
    loads = {uf.LD_W_ABS: 14, uf.LD_W_IND: 15, uf.LD_H_IND: 15, uf.LD_B_IND: 14}
    return 72 + 8 * (8 + sum(loads.get(i.code, 1) for i in prog))


PROG = uf.uevent_program(RDMA)


def uevent(action: str, devpath: str, subsystem: str, *more: str) -> bytes:
    """A uevent as the kernel writes it (lib/kobject_uevent.c)."""
    fields = [f"{action}@{devpath}", f"ACTION={action}", f"DEVPATH={devpath}"]
    fields += [f"SUBSYSTEM={subsystem}", *more, "SEQNUM=1234"]
    return b"".join(f.encode() + b"\0" for f in fields)


def test_the_program_is_within_the_kernels_limits() -> None:
    assert len(PROG) <= 4096  # BPF_MAXINSNS
    assert all(i.jt <= 255 and i.jf <= 255 for i in PROG)
    assert all(len(i.pack()) == 8 for i in PROG)
    # Linux <= 6.8's default net.core.optmem_max (Debian 12, Ubuntu 22.04, RHEL 8/9):
    # the byte-at-a-time search (~33 KiB) was refused there. tests/kernel/test_uevents.py
    # attaches it under that limit in a kernel.
    assert ebpf_size(PROG) < 20480 * 0.8
    assert [ebpf_size(uf.uevent_program(RDMA, scan)) for scan in uf.SCANS] == sorted(
        (ebpf_size(uf.uevent_program(RDMA, scan)) for scan in uf.SCANS), reverse=True
    )


@pytest.mark.parametrize("scan", [0, 6, -4])
def test_a_search_span_is_a_positive_multiple_of_four(scan: int) -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        uf.uevent_program(RDMA, scan)


@pytest.mark.parametrize(
    ("data", "kept"),
    [
        (uevent("remove", "/devices/virtual/infiniband/rxe0", "infiniband", "NAME=rxe0"), True),
        (uevent("add", "/devices/virtual/infiniband_verbs/uverbs0", "infiniband_verbs"), True),
        (uevent("add", "/devices/virtual/net/benchv0", "net", "INTERFACE=benchv0"), False),
        (uevent("add", "/devices/virtual/net/benchv0/queues/rx-0", "queues"), False),
        # Names that start like a wanted one are other subsystems.
        (uevent("add", "/devices/virtual/infiniband_mad/umad0", "infiniband_mad"), False),
        (uevent("add", "/devices/x/infini", "infini"), False),
        (uevent("add", "/devices/x/infinibandX", "infinibandX"), False),
        # A header longer than the search: let through (the reader's parse decides).
        (uevent("add", "/devices/" + "a" * uf.SCAN, "net"), True),
        # SUBSYSTEM= not where the layout puts it: let through.
        (b"add@/devices/x\0ACTION=add\0SUBSYSTEM=net\0DEVPATH=/devices/x\0", True),
        # Ending right after a wanted subsystem, or too short to hold one.
        (b"add@/d\0ACTION=add\0DEVPATH=/d\0SUBSYSTEM=infiniband\0", True),
        (b"add@/d\0ACTION=add\0DEVPATH=/d\0SUBSYSTEM=net\0", False),
        (b"add@/d\0ACTION=add\0DEVPATH=/d\0SUBSYSTEM=infini", False),
        (b"add@/d\0ACTION=add\0DEVPATH=/d\0SUBSYS", True),  # the key unread
    ],
)
def test_verdicts(data: bytes, kept: bool) -> None:
    assert (run(PROG, data) != 0) is kept


@pytest.mark.parametrize("scan", uf.SCANS)
def test_the_offset_follows_the_header_length_at_every_length(scan: int) -> None:
    prog = uf.uevent_program(RDMA, scan)
    for n in range(1, scan + 16):
        path = "/" + "d" * n
        assert run(prog, uevent("add", path, "infiniband")) == uf.ACCEPT, n
        header = len("add@") + len(path)  # the first NUL's offset
        dropped = run(prog, uevent("add", path, "pci")) == uf.DROP
        assert dropped is (header < scan), n  # beyond the span: let through


segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789:._-", min_size=1, max_size=24)
subsystems = st.sampled_from(
    [*RDMA, "net", "queues", "pci", "module", "infiniband_mad", "infiniban", "infinibandd", "x"]
)
actions = st.sampled_from(["add", "remove", "change", "move", "bind", "unbind", "online"])
# More KEY=value strings, as the kernel adds after SUBSYSTEM= (never one of the first three).
extra = st.lists(
    st.from_regex(r"[A-Z_]{1,12}=[ -~]{0,40}", fullmatch=True).filter(
        lambda f: f.partition("=")[0] not in ("ACTION", "DEVPATH", "SUBSYSTEM")
    ),
    max_size=6,
)


@given(actions, st.lists(segment, min_size=1, max_size=12), subsystems, extra)
def test_a_uevent_is_kept_exactly_when_its_subsystem_is_wanted(
    action: str, parts: list[str], subsystem: str, more: list[str]
) -> None:
    devpath = "/devices/" + "/".join(parts)
    data = uevent(action, devpath, subsystem, *more)
    header = len(action) + 1 + len(devpath)
    verdict = run(PROG, data)
    if subsystem in RDMA:
        assert verdict == uf.ACCEPT  # never a wanted one dropped
    elif header < uf.SCAN:
        assert verdict == uf.DROP
    if parse_uevent(data, WANTED) is not None:
        assert verdict == uf.ACCEPT


no_nul = st.binary(min_size=1, max_size=300).map(lambda b: b.replace(b"\0", b"/"))


@given(no_nul, no_nul, st.sampled_from(RDMA), extra)
def test_any_bytes_in_the_header_keep_a_wanted_uevent(
    action: bytes, devpath: bytes, subsystem: str, more: list[str]
) -> None:
    fields = [action + b"@" + devpath, b"ACTION=" + action, b"DEVPATH=" + devpath]
    fields += [f"SUBSYSTEM={subsystem}".encode(), *(m.encode() for m in more), b"SEQNUM=9"]
    assert run(PROG, b"".join(f + b"\0" for f in fields)) == uf.ACCEPT


def test_no_subsystem_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one subsystem"):
        uf.uevent_program([])


@given(st.binary(min_size=4, max_size=4))
def test_a_word_holds_a_zero_byte_exactly_when_the_test_says_so(word: bytes) -> None:
    w = int.from_bytes(word, "big")
    assert bool(((w - uf.ONES) & 0xFFFF_FFFF) & (w ^ 0xFFFF_FFFF) & uf.HIGHS) is (0 in word)
