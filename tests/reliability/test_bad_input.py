"""Bad input: generated drop-in sets on disk, reloads of them, and odd values read
from sysfs (names, MACs, GUIDs, counts). Nothing may raise out of the config loader,
the observer, the planner or the snapshot; every config error names its file and,
for files that parse, its key; a reload with errors keeps the last good config.

Earlier coverage this builds on (cited in tests/RELIABILITY.md): tests/unit/test_config.py
(any bytes, any merged shapes, unreadable / vanishing / FIFO / symlink-loop files and
directories) and tests/api/test_endpoints.py + test_limits.py (malformed, oversized,
half-sent and stalled API requests).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from rdmad import config
from rdmad.agent import Agent, AgentOptions
from rdmad.config import ConfigInvalid
from rdmad.kernel.apply.host import KernelHost
from rdmad.model import PlanState, SetNumVfs
from rdmad.reconcile import plan
from rdmad.snapshot import snapshot
from rdmad.tomlcompat import tomllib
from tests.agent.conftest import FakeHost, Notes
from tests.support.fakeclock import FakeClock
from tests.support.fakesysfs import DEV, IGB_PF, MLX5_PF, MLX5_VFS, mlx5_node

GOOD = '[[rxe]]\nname = "rxe0"\nnetdev = { name = "eth0" }\n'
KEYS = [
    "name", "netdev", "pf", "pci", "mac", "numvfs", "vf", "index", "vlan", "qos", "trust",
    "spoofchk", "driver", "node_guid", "policy", "in_use_drift", "settle", "mode", "listen",
    "socket", "read_group", "drift_interval", "log_level", "bogus",
]  # fmt: skip
SCALARS = (
    st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.text(max_size=16)
    | st.sampled_from(
        [
            "eth0",
            "0000:3b:00.0",
            "02:00:00:00:00:01",
            "00:11:22:33:44:55:66:77",
            "5m",
            "none",
            "report",
            "Up",
            "../../etc",
            "/abs",
            "a;b",
            "127.0.0.1:9478",
            "0.0.0.0:1",
        ]
    )
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS), inner, min_size=1, max_size=3)
    ),
    max_leaves=8,
)
SECTIONS = st.sampled_from(["rxe", "sriov", "daemon", "peermem", "api", "metrics", "oops"])
DOCS = st.dictionaries(
    SECTIONS,
    st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4), min_size=1, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4)
    | SCALARS,
    max_size=3,
)
# Valid drop-ins too, so reloads go both ways (most generated documents are invalid).
VALID_DOC = st.builds(
    lambda name, dev: {"rxe": [{"name": name, "netdev": {"name": dev}}]},
    st.from_regex(r"rxe[0-9]{1,2}", fullmatch=True),
    st.sampled_from(["eth0", "eth1", "ib0", "a;b$c"]),
)
DROPIN_SETS = st.lists(DOCS | VALID_DOC | VALID_DOC, min_size=1, max_size=4)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_doc(doc: dict[str, Any]) -> str:
    """Render a document: scalars first, then tables, then arrays of tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict | list)]
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list):
            for item in value:
                lines.append(f"[[{key}]]")
                lines.extend(f"{k} = {toml_value(v)}" for k, v in item.items())
    return "\n".join(lines) + "\n"


def write_set(d: Path, docs: list[dict[str, Any]]) -> list[str]:
    shutil.rmtree(d / "rdmad.d", ignore_errors=True)
    (d / "rdmad.d").mkdir()
    names = []
    for i, doc in enumerate(docs):
        path = d / "rdmad.d" / f"{i:02d}-gen.toml"
        text = toml_doc(doc)
        assume(_parses(text))
        path.write_text(text)
        names.append(str(path))
    return names


def _parses(text: str) -> bool:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False  # duplicate keys from the generator: not what is tested here
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(DROPIN_SETS)
def test_generated_dropin_sets_load_or_name_file_and_key(docs: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "rdmad.toml").write_text(GOOD)
        names = write_set(d, docs)
        try:
            config.load(d)
            event("valid config")
        except ConfigInvalid as exc:
            event("invalid config")
            assert exc.errors
            for err in exc.errors:
                assert err.file in {str(d / "rdmad.toml"), *names}, err
                assert err.path, f"no key named: {err}"  # every file here parses
                assert err.message, err


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(DROPIN_SETS)
def test_a_reload_with_errors_keeps_the_last_good_config(docs: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "rdmad.toml").write_text(GOOD)
        (d / "rdmad.d").mkdir()
        agent = Agent(
            FakeHost(),
            lambda: config.load(d),
            clock=FakeClock(),
            notifier=Notes(),
            state_store=None,
            boot_id="boot-1",
            options=AgentOptions(),
        )
        memory = agent.memory
        assert memory.reload_config(initial=True)
        good = memory.desired
        write_set(d, docs)
        try:
            want = config.load(d).desired
        except ConfigInvalid as exc:
            assert not memory.reload_config(initial=False)
            assert memory.desired == good and memory.config_ok
            assert list(memory.config_errors) == [str(e) for e in exc.errors]
        else:
            assert memory.reload_config(initial=False)
            assert memory.desired == want and memory.config_errors == ()


# --- odd values read from sysfs ------------------------------------------------------------

NAME_CHARS = st.characters(blacklist_characters="/:\x00 \t\n", blacklist_categories=("Cs",))
NAMES = st.text(NAME_CHARS, min_size=1, max_size=15).filter(
    lambda s: s not in (".", "..") and len(s.encode()) <= 15
)
ODD_TEXT = st.text(max_size=80) | st.binary(max_size=40).map(lambda b: b.decode("latin-1"))
COUNT = st.integers(0, 300).map(str)
ODD = st.fixed_dictionaries(
    {
        "netdev": NAMES,
        "mac": ODD_TEXT,
        "ifindex": ODD_TEXT,
        "node_guid": ODD_TEXT,
        "vf_guid": ODD_TEXT,
        "policy": ODD_TEXT,
        # Counts: garbage, or a number (valid or not for this PF) as the kernel writes it.
        "numvfs": ODD_TEXT | COUNT,
        "totalvfs": ODD_TEXT | COUNT,
        "operstate": ODD_TEXT,
    }
)


def declared(netdev: str) -> dict[str, Any]:
    return {
        "sriov": [
            {"pf": {"pci": MLX5_PF}, "numvfs": 4,
             "vf": [{"index": 0, "node_guid": "00:11:22:33:44:55:66:77"}]},
            {"pf": {"pci": IGB_PF}, "numvfs": 2},  # its counts are the odd ones
            {"pf": {"name": netdev}, "numvfs": 2},
        ],
        "rxe": [{"name": "rxe0", "netdev": {"name": netdev}}],
    }  # fmt: skip


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ODD)
def test_odd_names_macs_guids_and_counts_in_sysfs_never_crash(odd: dict[str, str]) -> None:
    """A netdev with any valid-but-unusual name and garbage in the attributes rdmad
    parses: observe, plan (with a config naming that netdev) and snapshot all return;
    a count that is a number is read as that number; and whatever the files say, the
    plan destroys no VF and touches no VF in use."""
    root = Path(tempfile.mkdtemp(prefix="rdmad-odd-"))
    try:
        fs = mlx5_node(root)
        fs.netdev(odd["netdev"], IGB_PF, odd["mac"])
        base = f"{DEV}/{IGB_PF}/net/{odd['netdev']}"
        _write(root, f"{base}/ifindex", odd["ifindex"])
        _write(root, f"{base}/operstate", odd["operstate"])
        _write(root, f"{DEV}/{IGB_PF}/sriov_numvfs", odd["numvfs"])
        _write(root, f"{DEV}/{IGB_PF}/sriov_totalvfs", odd["totalvfs"])
        _write(root, "sys/class/infiniband/mlx5_0/node_guid", odd["node_guid"])
        _write(root, f"{DEV}/{MLX5_PF}/sriov/0/node", odd["vf_guid"])
        _write(root, f"{DEV}/{MLX5_PF}/sriov/1/policy", odd["policy"])
        observed = asyncio.run(KernelHost(root).observe())
        assert any(n.name == odd["netdev"] for n in observed.netdevs)
        desired, errors = config.parse([("t.toml", declared(odd["netdev"]))])
        if desired is None:
            # The kernel allows control characters in names, a config does not: such a
            # netdev is declared by MAC or PCI address instead.
            assert {e.path for e in errors} == {"sriov[2].pf.name", "rxe[0].netdev.name"}
            desired, errors = config.parse([("t.toml", declared("eth0"))])
            assert desired is not None, errors
        [igb] = [p for p in observed.pfs if p.pci == IGB_PF]
        for attr in ("numvfs", "totalvfs"):
            if odd[attr].isdecimal() and odd[attr].isascii():
                assert getattr(igb, attr) == int(odd[attr]), (attr, odd[attr], igb)
        actions = plan(desired, observed, PlanState())
        # The igb PF shows none of its VFs (no virtfn links): whatever its count reads,
        # none may be destroyed on its word (a write of 0), and QEMU's VF 1 of the mlx5
        # PF is never written, whatever its policy file holds.
        destroys = [a for a in actions if isinstance(a, SetNumVfs) and a.new == 0]
        assert destroys == [], destroys
        held = [
            a
            for a in actions
            if a.changes_kernel
            and (getattr(a, "vf", None) == 1 or getattr(a, "vf_pci", None) == MLX5_VFS[1])
        ]
        assert held == [], held
        snapshot(observed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
