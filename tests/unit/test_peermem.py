"""rdmad.peermem: facts from fake trees, the decision, and each finding from captured
modprobe stderr and kernel log lines (kmod 30, kernel 6.1 wording)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad.kernel.sysfs import Sysfs
from rdmad.peermem.choice import Held, decide
from rdmad.peermem.facts import (
    ModuleFile,
    PeermemFacts,
    btf_names,
    exports,
    gather,
    parse_modules_dep,
)
from rdmad.peermem.findings import diagnose, dmabuf_finding, preflight
from tests.support.fakesysfs import PEERMEM_KO, RELEASE, SIGNED, UNSIGNED, gpu_node

P2P_KO = "updates/dkms/nvidia-p2p.ko"
DUMMY = b"ib_register_client" + UNSIGNED  # like the lab's dummy: no peer-memory API


def facts_of(root: Path, **kw: object) -> PeermemFacts:
    gpu_node(root, **kw)  # type: ignore[arg-type]
    return gather(Sysfs(root))


# --- facts --------------------------------------------------------------------------------


def test_gathers_a_mofed_gpu_node(tmp_path: Path) -> None:
    f = facts_of(tmp_path, kallsyms=("ib_register_peer_memory_client", "ib_umem_dmabuf_get"))
    assert f.release == RELEASE
    assert {"nvidia", "ib_core", "mlx5_ib"} <= f.loaded
    assert f.module() == ModuleFile(
        "nvidia_peermem", PEERMEM_KO, signed=True, needs_peer_api=True, size=f.files[0].size
    )
    assert f.peer_api is True and f.dmabuf_symbol is True
    assert f.open_gpu_modules is False  # "PO": the proprietary driver
    assert f.loading_disabled is False and f.sig_enforce is False
    assert f.unread == ()


def test_builtin_ib_core_and_mlx5_count_as_loaded(tmp_path: Path) -> None:
    # Built in: /sys/module/NAME without initstate or holders, absent from /proc/modules.
    f = facts_of(
        tmp_path,
        loaded=("nvidia",),
        builtin=("ib_core", "mlx5_core", "mlx5_ib"),
        kallsyms=("ib_register_peer_memory_client",),
    )
    assert {"ib_core", "mlx5_core", "mlx5_ib"} <= f.builtin
    assert {"nvidia", "ib_core"} <= f.loaded
    assert decide("auto", f).verdict == "load"


def test_iGPU_node_gets_nvidia_p2p(tmp_path: Path) -> None:
    f = facts_of(tmp_path, installed={P2P_KO: SIGNED})
    assert f.module() is not None and f.module().name == "nvidia_p2p"  # type: ignore[union-attr]
    d = decide("auto", f)
    assert (d.verdict, d.module) == ("load", "nvidia_p2p")


def test_peermem_preferred_when_both_are_installed(tmp_path: Path) -> None:
    f = facts_of(tmp_path, installed={P2P_KO: SIGNED, PEERMEM_KO: SIGNED})
    assert [m.name for m in f.files] == ["nvidia_peermem", "nvidia_p2p"]


def test_without_modules_dep_the_tree_is_searched(tmp_path: Path) -> None:
    f = facts_of(tmp_path, modules_dep=False)
    assert not f.modules_dep
    assert f.module() is not None and f.module().path == PEERMEM_KO  # type: ignore[union-attr]


def test_unreadable_kallsyms_is_said_and_the_ib_core_file_is_asked(tmp_path: Path) -> None:
    f = facts_of(tmp_path, kallsyms=None)
    assert any("kallsyms" in u for u in f.unread)
    assert f.peer_api is None  # no readable ib_core.ko in the fake tree either: unknown


def test_no_gpu_driver_reads_only_the_cheap_facts(tmp_path: Path) -> None:
    gpu_node(tmp_path, loaded=("ib_core",))
    f = gather(Sysfs(tmp_path), full=False)
    assert not f.probed and f.files == ()
    assert decide("auto", f).verdict == "not-needed"
    d = decide("require", f)
    assert d.verdict == "waiting" and "NVIDIA GPU driver" in d.reason


# --- decision -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "loaded", "verdict"),
    [
        ("off", ("nvidia", "ib_core"), "off"),
        ("auto", ("ib_core",), "not-needed"),
        ("auto", ("nvidia",), "not-needed"),
        ("require", ("nvidia",), "waiting"),
        ("auto", ("nvidia", "ib_core"), "load"),
        ("require", ("nvidia", "ib_core"), "load"),
        ("auto", ("nvidia", "ib_core", "nvidia_peermem"), "loaded"),
        ("auto", ("nvidia", "ib_core", "nvidia_p2p"), "loaded"),
    ],
)
def test_decision_table(tmp_path: Path, mode: str, loaded: tuple[str, ...], verdict: str) -> None:
    f = facts_of(tmp_path, loaded=loaded)
    assert decide(mode, f).verdict == verdict  # type: ignore[arg-type]


def test_modules_disabled_blocks_before_any_modprobe(tmp_path: Path) -> None:
    fs = gpu_node(tmp_path)
    fs.write("proc/sys/kernel/modules_disabled", "1")
    d = decide("auto", gather(Sysfs(tmp_path)))
    assert d.verdict == "cannot-load"
    assert d.blocking is not None and d.blocking.id == "modules-disabled" and d.blocking.lasting


def test_missing_module_file(tmp_path: Path) -> None:
    d = decide("auto", facts_of(tmp_path, installed={}))
    assert d.verdict == "cannot-load"
    assert d.blocking is not None and d.blocking.id == "module-not-found"
    assert f"/lib/modules/{RELEASE}" in d.blocking.evidence


def test_signature_enforcement_with_an_unsigned_module(tmp_path: Path) -> None:
    f = facts_of(tmp_path, sig_enforce=True, installed={PEERMEM_KO: UNSIGNED})
    assert [x.id for x in preflight(f)] == ["unsigned-module"]
    assert preflight(facts_of(tmp_path / "b", sig_enforce=True)) == []  # signed: fine


def test_inbox_ib_core_without_the_peer_memory_api(tmp_path: Path) -> None:
    # The module needs ib_register_peer_memory_client; the inbox ib_core lacks it.
    f = facts_of(tmp_path, kallsyms=("ib_register_client", "ib_umem_dmabuf_get"))
    assert f.peer_api is False
    d = decide("auto", f)
    assert d.blocking is not None and d.blocking.id == "no-peer-memory-api"
    assert "MOFED" in d.blocking.suggestion


def test_a_module_that_does_not_need_the_api_loads_on_an_inbox_kernel(tmp_path: Path) -> None:
    f = facts_of(tmp_path, installed={PEERMEM_KO: DUMMY}, kallsyms=("ib_register_client",))
    assert decide("auto", f).verdict == "load"


def test_dmabuf_is_offered_with_open_gpu_modules_on_a_new_kernel(tmp_path: Path) -> None:
    f = facts_of(tmp_path, nvidia_taint="OE", installed={})
    d = decide("auto", f)
    ids = [x.id for x in d.findings]
    assert ids == ["module-not-found", "dmabuf-available"]
    assert "without a peer-memory module" in d.findings[1].suggestion
    # The proprietary driver, or an old kernel: not offered.
    assert dmabuf_finding(facts_of(tmp_path / "p", nvidia_taint="PO")) is None
    assert dmabuf_finding(facts_of(tmp_path / "o", nvidia_taint="O", release="5.10.0-9")) is None


def test_a_held_failure_holds_while_the_facts_are_the_same(tmp_path: Path) -> None:
    f = facts_of(tmp_path, installed={PEERMEM_KO: DUMMY})
    finding = diagnose(
        "nvidia-peermem",
        "modprobe: ERROR: could not insert 'nvidia_peermem': Key was rejected by service",
    )
    held = Held("nvidia_peermem", finding, f.fingerprint())
    assert decide("auto", f, held).verdict == "cannot-load"
    # ib_uverbs went away (an RDMA stack restart): the facts changed, try again.
    moved = PeermemFacts(**{**_fields(f), "loaded": f.loaded - {"ib_uverbs"}})
    assert decide("auto", moved, held).verdict == "load"


def _fields(f: PeermemFacts) -> dict[str, object]:
    return {k: getattr(f, k) for k in f.__slots__}  # type: ignore[attr-defined]


# --- findings from modprobe's stderr and the kernel log --------------------------------------

INSERT = "modprobe: ERROR: could not insert 'nvidia_peermem': "


@pytest.mark.parametrize(
    ("stderr", "log", "fid", "lasting"),
    [
        (
            f"modprobe: FATAL: Module nvidia-peermem not found in directory /lib/modules/{RELEASE}",
            [],
            "module-not-found",
            True,
        ),
        (
            INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
            [
                "4,1043,81234567,-;nvidia_peermem: disagrees about version of symbol "
                "ib_register_peer_memory_client"
            ],
            "symbol-version-mismatch",
            True,
        ),
        (
            INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
            [
                "4,1044,81234569,-;nvidia_peermem: Unknown symbol "
                "ib_register_peer_memory_client (err -2)"
            ],
            "unknown-symbol",
            True,
        ),
        (
            INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
            ["4,1045,81234570,-;nvidia_peermem: unknown parameter 'peerdirect_support' ignored"],
            "invalid-parameter",
            True,
        ),
        (
            INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
            [],
            "unknown-symbol",
            True,
        ),
        (INSERT + "Key was rejected by service", [], "unsigned-module", True),
        (INSERT + "Required key not available", [], "unsigned-module", True),
        (
            INSERT + "Invalid argument",
            ["3,1050,81234600,-;nvidia_peermem: disagrees about version of symbol ib_query_port"],
            "symbol-version-mismatch",
            True,
        ),
        (INSERT + "Invalid argument", [], "load-rejected", True),
        (INSERT + "Operation not permitted", [], "modules-disabled", True),
        (INSERT + "Cannot allocate memory", [], "modprobe-failed", False),
    ],
)
def test_diagnose(stderr: str, log: list[str], fid: str, lasting: bool) -> None:
    f = diagnose("nvidia-peermem", stderr, log)
    assert (f.id, f.lasting) == (fid, lasting)
    assert f.evidence and f.suggestion


def test_kernel_log_lines_about_other_modules_are_ignored() -> None:
    f = diagnose(
        "nvidia-peermem",
        INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
        ["4,1,1,-;rdma_rxe: disagrees about version of symbol ib_device_get_by_netdev"],
    )
    assert f.id == "unknown-symbol"


def test_unknown_symbol_on_an_inbox_ib_core_says_install_mofed() -> None:
    facts = PeermemFacts(peer_api=False)
    f = diagnose(
        "nvidia-peermem",
        INSERT + "Unknown symbol in module, or unknown parameter (see dmesg)",
        [],
        facts,
    )
    assert "MOFED" in f.suggestion and "inbox" in f.suggestion


def test_symbol_mismatch_suggests_the_install_order() -> None:
    f = diagnose(
        "nvidia-peermem",
        INSERT + "Invalid argument",
        ["nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client"],
    )
    assert "DKMS" in f.suggestion and "MOFED" in f.suggestion


def test_kallsyms_match_is_by_whole_name() -> None:
    text = (
        b"ffff T __ksymtab_ib_register_peer_memory_client\t[ib_core]\n"
        b"ffff T ib_umem_dmabuf_get_pinned\n"
    )
    assert not exports(text, "ib_register_peer_memory_client")
    assert not exports(text, "ib_umem_dmabuf_get")
    assert exports(text + b"ffff T ib_umem_dmabuf_get\t[ib_core]\n", "ib_umem_dmabuf_get")
    assert exports(b"ffff T ib_umem_dmabuf_get", "ib_umem_dmabuf_get")  # the text's end
    assert not exports(b"ib_umem_dmabuf_get T x\n", "ib_umem_dmabuf_get")  # no field before


def test_btf_match_is_by_whole_name(tmp_path: Path) -> None:
    fs = gpu_node(tmp_path, btf=("ib_umem_dmabuf_get_pinned", "my_ib_umem_dmabuf_get", "x"))
    data = fs.root.joinpath("sys/kernel/btf/ib_uverbs").read_bytes()
    assert not btf_names(data, "ib_umem_dmabuf_get")
    assert btf_names(data, "ib_umem_dmabuf_get_pinned") and btf_names(data, "x")
    assert btf_names(data + b"ib_umem_dmabuf_get\0", "ib_umem_dmabuf_get")
    assert not btf_names(data + b"ib_umem_dmabuf_get", "ib_umem_dmabuf_get")  # unterminated


def test_the_dmabuf_symbol_is_ib_uverbs_and_unknown_without_it(tmp_path: Path) -> None:
    """The kernel links ib_umem_dmabuf_get into ib_uverbs: with ib_core alone nothing
    has it yet, which is "not known" (ib_uverbs' arrival is a module event), not "no"."""
    loaded = ("nvidia", "ib_core", "mlx5_core")
    f = facts_of(tmp_path, loaded=loaded, nvidia_taint="O", kallsyms=("ib_register_client",))
    assert f.dmabuf_symbol is None and f.peer_api is False
    f = facts_of(tmp_path / "v", nvidia_taint="O", kallsyms=("ib_register_client",))
    assert f.dmabuf_symbol is False  # ib_uverbs loaded, and kallsyms lists it not


def _exports_by_regex(kallsyms: bytes, symbol: str) -> bool:
    """The definition: a whole name, after a space or tab, before one, a newline or the end."""
    word = rb"[ \t]" + re.escape(symbol.encode()) + rb"(?:[ \t\n]|$)"
    return re.search(word, kallsyms) is not None


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["T ", "t ", "D ", "T\t", " ", ""]),
            st.sampled_from(["ib_umem_dmabuf_get", "ib_umem_dmabuf_get_pinned", "x", "_get"]),
            st.sampled_from(["\t[ib_core]", "", " ", "_x", "\t"]),
        ),
        max_size=6,
    ),
    st.sampled_from(["\n", " ", ""]),
)
def test_kallsyms_match_is_the_whole_word_definition(
    lines: list[tuple[str, str, str]], sep: str
) -> None:
    text = sep.join(f"ffff {kind}{name}{tail}" for kind, name, tail in lines).encode()
    for symbol in ("ib_umem_dmabuf_get", "_get", "x"):
        assert exports(text, symbol) == _exports_by_regex(text, symbol), (text, symbol)


def _modules_dep_line_by_line(text: str, wanted: list[str]) -> dict[str, str]:
    """The definition: each "PATH: DEPS" line in order, the first whose file is the module."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        path, sep, _ = line.partition(":")
        name = path.rsplit("/", 1)[-1].split(".ko", 1)[0].replace("-", "_")
        if sep and name in wanted and name not in out:
            out[name] = path.strip()
    return out


WANTED = ["nvidia_peermem", "nvidia_p2p", "ib_core", "nvidia", "rdma_rxe", "x"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "kernel/", "updates/dkms/", "a/ib_core.ko/", " ", "x:"]),
            st.sampled_from(
                [
                    "nvidia-peermem",
                    "nvidia_peermem",
                    "nvidia-p2p",
                    "nvidia",
                    "ib_core",
                    "ib-core",
                    "mlx5_core",
                    "ib_core2",
                    "nvidia_peermemx",
                    "rdma_rxe",
                    "x",
                    "_x",
                    "",
                ]
            ),
            st.sampled_from([".ko", ".ko.zst", ".ko.xz", "", ".kox"]),
            st.sampled_from([":", ": kernel/ib_core.ko", ": updates/nvidia-peermem.ko", " :", ""]),
        ),
        max_size=8,
    ),
)
def test_modules_dep_lookup_is_the_line_by_line_definition(
    lines: list[tuple[str, str, str, str]],
) -> None:
    text = "\n".join(f"{d}{n}{k}{t}" for d, n, k, t in lines)
    for wanted in (WANTED, WANTED[:1], ["ib_core", "ib_core"]):
        got = parse_modules_dep(text, wanted)
        assert got == _modules_dep_line_by_line(text, wanted), (text, wanted)


def test_modules_dep_lookup_takes_the_module_not_a_dependency_or_a_longer_name() -> None:
    text = (
        "kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko: kernel/ib_core.ko\n"
        "updates/dkms/nvidia-peermem-old.ko:\n"
        "kernel/drivers/infiniband/core/ib_core.ko.zst:\n"
        "updates/dkms/nvidia-peermem.ko: updates/dkms/nvidia.ko kernel/ib_core.ko\n"
        "kernel/other/nvidia-peermem.ko:"
    )
    assert parse_modules_dep(text, ["nvidia_peermem", "ib_core", "nvidia"]) == {
        "nvidia_peermem": "updates/dkms/nvidia-peermem.ko",
        "ib_core": "kernel/drivers/infiniband/core/ib_core.ko.zst",
    }


@pytest.mark.parametrize("suffix", [".ko.xz", ".ko.gz"])
def test_compressed_modules_are_read_inside(tmp_path: Path, suffix: str) -> None:
    import gzip
    import lzma

    body = b"ib_register_peer_memory_client" + UNSIGNED
    data = lzma.compress(body) if suffix == ".ko.xz" else gzip.compress(body)
    f = facts_of(tmp_path, installed={f"updates/dkms/nvidia-peermem{suffix}": data})
    assert f.module() == ModuleFile(
        "nvidia_peermem",
        f"updates/dkms/nvidia-peermem{suffix}",
        signed=False,
        needs_peer_api=True,
        size=len(body),
    )


def test_zstd_module_signature_is_unknown_not_guessed(tmp_path: Path) -> None:
    f = facts_of(
        tmp_path, sig_enforce=True, installed={"updates/dkms/nvidia-peermem.ko.zst": b"\x28\xb5"}
    )
    assert f.module() is not None and f.module().signed is None  # type: ignore[union-attr]
    assert preflight(f) == []  # unknown is not "unsigned": modprobe's answer will say
