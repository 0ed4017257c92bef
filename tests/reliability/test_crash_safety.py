"""Crash safety on a fake node: the real agent and KernelHost, SIGKILLed mid-apply.

Each seed is a chain of runs of tests/reliability/crash_worker.py against one tree:
up to KILLS runs each stop at a kill point the seed picks (a kernel write before it
reaches the kernel or after it took effect, or a state-file rename) and are killed
with SIGKILL there; then a run without a kill point must converge. After every kill
the state file must read (old or new, never half); at the end the node must be as
declared, the VF in use (held by a QEMU process in the tree) never touched, no
write refused for being repeated (numvfs over a non-zero count, an rxe link that
exists) and the VF count and rxe link each created exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rdmad.state import read_state
from tests.agent.conftest import FakeHost, RigFactory, desired, until
from tests.support.fakesysfs import DEV, IGB_PF, MLX5_PF, MLX5_VFS, mlx5_node

REPO = Path(__file__).resolve().parents[2]
SEEDS = range(24)
KILLS = 5  # kill points per seed (a chain ends early once a run converges)
IN_USE_VF = MLX5_VFS[1]  # on vfio-pci, /dev/vfio/61 held by pid 4242
CONFIG = f"""
[[sriov]]
pf = {{ pci = "{MLX5_PF}" }}
numvfs = 4
[[sriov.vf]]
index = 0
node_guid = "00:11:22:33:44:55:66:01"
port_guid = "00:11:22:33:44:55:66:02"
[[sriov.vf]]
index = 1
node_guid = "00:11:22:33:44:55:66:11"
[[sriov.vf]]
index = 2
driver = "vfio-pci"

[[sriov]]
pf = {{ pci = "{IGB_PF}" }}
numvfs = 4

[[rxe]]
name = "rxe0"
netdev = {{ name = "eth0" }}
"""
RUN_DEADLINE = 60.0


@dataclass
class Node:
    root: Path
    cfg: Path
    state: Path
    journal: Path
    logs: Path
    runs: list[str] = field(default_factory=list)

    def worker(self, stall: str) -> tuple[str, dict[str, Any] | None]:
        """One run: ("killed", None) at its kill point, or ("exited", its report)."""
        marker = Path(f"{self.journal}.stalled")
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        log = (self.logs / f"run-{len(self.runs)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.crash_worker",
             str(self.root), str(self.cfg), str(self.state), str(self.journal), stall],
            cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + RUN_DEADLINE
            while time.monotonic() < deadline:
                if marker.exists():
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                    self.runs.append(f"killed at {marker.read_text()}")
                    return "killed", None
                if proc.poll() is not None:
                    out = proc.stdout.read() if proc.stdout else ""
                    self.runs.append(f"exited {proc.returncode} ({stall})")
                    assert proc.returncode == 0, (out, (self.logs / log.name).read_text()[-3000:])
                    return "exited", json.loads(out.strip().splitlines()[-1])
                time.sleep(0.005)
            raise AssertionError(f"run with {stall} neither stalled nor ended: {self.runs}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()

    def journal_entries(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    root = tmp_path / "root"
    mlx5_node(root)
    (root / "etc/modprobe.d").mkdir(parents=True)
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "rdmad.toml").write_text(CONFIG)
    logs = tmp_path / "logs"
    logs.mkdir()
    return Node(root, cfg, tmp_path / "state", tmp_path / "journal", logs)


def kill_point(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return f"save:{rng.randint(1, 2)}"
    return f"write:{rng.randint(1, 4)}:{rng.choice(['before', 'after'])}"


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_mid_apply_then_restart_converges_without_harm(node: Node, seed: int) -> None:
    rng = random.Random(seed)
    kills = 0
    for _ in range(KILLS):
        outcome, _ = node.worker(kill_point(rng))
        if outcome == "exited":
            break  # converged before reaching the kill point: nothing left to interrupt
        kills += 1
        state, problem = read_state(node.state / "state.json")
        assert problem is None, (problem, node.runs)  # the old file or the new, never half
    outcome, report = node.worker("none")
    assert outcome == "exited" and report is not None and report["converged"], node.runs
    print(f"seed {seed}: {kills} kills; runs: {node.runs}")
    assert kills >= 1, node.runs

    # Converged: every declared object as declared; the in-use VF's GUID still waits.
    objects = report["objects"]
    assert objects[f"sriov pci={IGB_PF}"][0] == "converged"
    assert objects["rxe rxe0"][0] == "converged"
    assert objects[f"sriov pci={MLX5_PF}"][0] == "blocked"
    assert "in use" in objects[f"sriov pci={MLX5_PF}"][1]
    pf = node.root / DEV / IGB_PF
    assert (pf / "sriov_numvfs").read_text().strip() == "4"
    assert sorted(p.name for p in pf.glob("virtfn*")) == [f"virtfn{i}" for i in range(4)]
    sriov = node.root / DEV / MLX5_PF / "sriov"
    assert (sriov / "0/node").read_text().strip() == "00:11:22:33:44:55:66:01"
    assert os.readlink(node.root / DEV / MLX5_VFS[2] / "driver").endswith("/vfio-pci")

    # No harm across all runs: the in-use VF untouched, nothing refused as a repeat,
    # the VF count and the rxe link each made once.
    entries = node.journal_entries()
    touched = [e for e in entries if IN_USE_VF in json.dumps(e) or "/sriov/1/" in e["rel"]]
    assert touched == [], touched
    assert (node.root / DEV / IN_USE_VF / "driver").resolve().name == "vfio-pci"
    assert [e for e in entries if e["at"] == "refused"] == []
    assert not [e for e in entries if e["rel"].endswith(f"{MLX5_PF}/sriov_numvfs")]
    done = [e for e in entries if e["at"] == "done"]
    assert len([e for e in done if e["rel"].endswith(f"{IGB_PF}/sriov_numvfs")]) == 1
    assert len([e for e in done if e["rel"] == "rdma link add rxe0"]) == 1
    state, problem = read_state(node.state / "state.json")
    assert problem is None and state is not None
    # rdmad knows the link it created is its own, whatever run created it and wherever
    # that run was killed (the claim is written before the link is made).
    assert state.managed_rxe == {"rxe0"}


async def test_an_rxe_link_is_claimed_on_disk_before_it_is_created(
    rig: RigFactory, tmp_path: Path
) -> None:
    """The ownership a crash must not lose: on disk while the create is in flight, and
    dropped again when the create fails (a link rdmad did not make is not its own)."""
    host = FakeHost(gate=asyncio.Event(), fail={"rxe1": errno.EEXIST})
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")), host=host, state_dir=tmp_path / "s")
    # What a restart would read just before each save: the refused rxe1 must be gone
    # from it already (a crash before the save must not make a link of that name,
    # someone else's, rdmad's).
    store = r.agent.memory.state_store
    assert store is not None
    before_save: list[set[str]] = []
    save = store.save

    def saving(state: Any) -> str | None:
        disk, _ = read_state(tmp_path / "s" / "state.json")
        before_save.append(set(disk.managed_rxe) if disk is not None else set())
        return save(state)

    store.save = saving  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(r.agent.run())
    await until(lambda: host.in_apply, "create in flight")
    on_disk, problem = read_state(tmp_path / "s" / "state.json")
    assert problem is None and on_disk is not None and "rxe0" in on_disk.managed_rxe
    host.gate.set()  # type: ignore[union-attr]
    await until(lambda: len(r.agent.passes) >= 1, "first pass")
    assert r.agent.state.managed_rxe == {"rxe0"}  # rxe1 failed with EEXIST: not claimed
    assert before_save and all("rxe1" not in names for names in before_save), before_save
    r.task = task
    await r.stop()
    on_disk, _ = read_state(tmp_path / "s" / "state.json")
    assert on_disk is not None and on_disk.managed_rxe == {"rxe0"}
