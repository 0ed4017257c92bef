"""The real agent and KernelHost on a fake node tree, in a process a test kills.

``python -m tests.reliability.crash_worker ROOT CONFIG STATE_DIR JOURNAL [STALL]``

The tree behaves like the kernel where it matters for a crash: writing sriov_numvfs
creates or removes the VFs (and a non-zero count over a non-zero count is EBUSY),
unbind / drivers_probe unbind and bind, an rxe link added over "RDMA netlink" appears
under /sys/class/infiniband. Every kernel write is appended to JOURNAL (fsync'ed, one
JSON line per attempt and per completion) so the test sees all runs' writes.

STALL ``write:K:before|after`` stops the process forever at its K-th kernel write (before
it reaches the kernel, or after it took effect and before rdmad records it);
``save:K`` at its K-th state-file rename (temp file written, not yet renamed). Then
the marker file ``JOURNAL.stalled`` appears and the test sends SIGKILL. Without STALL
the agent runs until a pass applies nothing, prints one JSON line and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rdmad import config
from rdmad.agent import Agent, AgentOptions
from rdmad.clock import SystemClock
from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.errors import KernelError
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.model import RdmaLinkObserved
from rdmad.state import StateStore
from tests.agent.conftest import Notes
from tests.support.fakesysfs import DEV, FakeSysfs

RXE_GUID = "02:00:00:ff:fe:00:00:01"


class Stall:
    """Where this run stops: the K-th kernel write or state-file rename."""

    def __init__(self, spec: str, marker: Path) -> None:
        kind, _, rest = spec.partition(":")
        at, _, phase = rest.partition(":")
        self.kind = kind
        self.at = int(at) if at else -1
        self.phase = phase
        self.marker = marker
        self.seen = {"write": 0, "save": 0}

    def point(self, kind: str, phase: str = "", what: str = "") -> None:
        """Called at each kill point; never returns at the chosen one."""
        if phase in ("", "before"):
            self.seen[kind] += 1  # the K-th write is counted when it starts
        if kind != self.kind or phase != self.phase:
            return
        if self.seen[kind] == self.at:
            self.marker.write_text(f"{kind} {self.at} {phase} {what}".strip())
            while True:  # the test's SIGKILL ends this
                time.sleep(3600)


class Journal:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, **entry: Any) -> None:
        os.write(self.fd, (json.dumps(entry) + "\n").encode())
        os.fsync(self.fd)


class KernelTree(Sysfs):
    """A fake tree that answers writes as the kernel does (see the module doc)."""

    def __init__(self, root: Path, journal: Journal, stall: Stall) -> None:
        super().__init__(root)
        self.fs = FakeSysfs.__new__(FakeSysfs)
        self.fs.root = Path(root)
        self.journal = journal
        self.stall = stall

    def write(self, rel: str, value: str, *, op: str | None = None) -> None:
        self.journal.log(at="attempt", rel=rel, value=value, pid=os.getpid())
        self.stall.point("write", "before", f"{rel} {value}")
        if rel.endswith("/sriov_numvfs"):
            self._numvfs(rel, int(value))
        else:
            super().write(rel, value, op=op)
            self._bind_effects(rel, value.strip())
        self.journal.log(at="done", rel=rel, value=value, pid=os.getpid())
        self.stall.point("write", "after", f"{rel} {value}")

    def _numvfs(self, rel: str, count: int) -> None:
        pf = rel.split("/")[-2]
        current = self.read_int(rel) or 0
        if current and count:
            self.journal.log(at="refused", rel=rel, value=str(count), errno="EBUSY")
            raise KernelError("write sriov_numvfs", rel, 16)
        for index, vf in self.virtfns(pf).items():
            os.unlink(self.path(f"{DEV}/{pf}/virtfn{index}"))
            os.unlink(self.path(f"{PCI_DEVICES}/{vf}"))
            shutil.rmtree(self.path(f"{DEV}/{vf}"))
        bus = pf.rsplit(":", 1)[0]
        for i in range(count):
            self.fs.vf(pf, i, f"{bus}:{0x10 + i // 8:02x}.{i % 8}", "igbvf", 80 + i)
        super().write(rel, str(count))

    def _bind_effects(self, rel: str, pci: str) -> None:
        if rel.endswith("/unbind"):
            link = Path(self.path(f"{DEV}/{pci}/driver"))
            if link.is_symlink():
                link.unlink()
        elif rel == "sys/bus/pci/drivers_probe":
            override = self.read(f"{PCI_DEVICES}/{pci}/driver_override")
            driver = override if override not in (None, "", "(null)") else "mlx5_core"
            if self.exists(f"sys/bus/pci/drivers/{driver}") and not self.exists(
                f"{DEV}/{pci}/driver"
            ):
                os.symlink(f"../../../bus/pci/drivers/{driver}", self.path(f"{DEV}/{pci}/driver"))


class TreeRdma:
    """RDMA netlink for the tree: rxe links are virtual devices under /sys/class/infiniband."""

    reason: str | None = None
    lasting = True

    def __init__(self, tree: KernelTree) -> None:
        self.tree = tree

    def available(self) -> bool:
        return True

    async def links(self) -> list[RdmaLinkObserved]:
        out = []
        for name in self.tree.listdir("sys/class/infiniband"):
            parent = self.tree.read(f"sys/devices/virtual/infiniband/{name}/parent")
            if parent is not None:
                out.append(RdmaLinkObserved(name, "rxe", parent))
        return out

    async def add_link(self, name: str, link_type: str, netdev: str) -> None:
        self.tree.journal.log(at="attempt", rel=f"rdma link add {name}", value=netdev)
        self.tree.stall.point("write", "before", f"rdma link add {name}")
        if self.tree.exists(f"sys/class/infiniband/{name}"):
            self.tree.journal.log(at="refused", rel=f"rdma link add {name}", errno="EEXIST")
            raise KernelError(f"rdma link add {name}", name, 17)
        self.tree.fs.ib_device(name, None, RXE_GUID, netdev=netdev)
        self.tree.journal.log(at="done", rel=f"rdma link add {name}", value=netdev)
        self.tree.stall.point("write", "after", f"rdma link add {name}")

    async def delete_link(self, name: str) -> None:
        self.tree.journal.log(at="attempt", rel=f"rdma link delete {name}", value="")
        shutil.rmtree(self.tree.path(f"sys/devices/virtual/infiniband/{name}"))
        os.unlink(self.tree.path(f"sys/class/infiniband/{name}"))
        self.tree.journal.log(at="done", rel=f"rdma link delete {name}", value="")

    def close(self) -> None:
        pass


def stall_state_saves(stall: Stall) -> None:
    """Stop at a chosen rename of the state file (its temp file already written)."""
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if str(dst).endswith("state.json"):
            stall.point("save")
        real_replace(src, dst, **kw)

    os.replace = replace  # type: ignore[assignment]


async def run(root: Path, cfg: Path, state_dir: Path, journal: Path, stall: Stall) -> int:
    tree = KernelTree(root, Journal(journal), stall)
    host = KernelHost(root, rdma=TreeRdma(tree))
    host.sysfs = tree
    agent = Agent(
        host,
        lambda: config.load(cfg),
        clock=SystemClock(),
        notifier=Notes(),
        state_store=StateStore(state_dir),
        boot_id="boot-1",
        options=AgentOptions(settle=0.01, backoff_base=0.05, backoff_cap=0.2, vf_wait=5.0),
    )
    task = asyncio.get_running_loop().create_task(agent.run())
    for _ in range(3000):  # 30 s at most
        await asyncio.sleep(0.01)
        last = agent.passes[-1] if agent.passes else None
        busy = agent.queue.pending or agent.backoff.failures()
        if last is not None and last.applied == 0 and not busy and agent.ready:
            break
    else:
        print(json.dumps({"converged": False, "passes": len(agent.passes)}))
        return 3
    objects = {o.obj: (o.state.value, o.message) for o in agent.status.current.objects}
    agent.stop()
    await asyncio.wait_for(task, 10)
    print(json.dumps({"converged": True, "passes": len(agent.passes), "objects": objects}))
    return 0


def main(argv: list[str]) -> int:
    root, cfg, state_dir, journal = (Path(a) for a in argv[:4])
    stall = Stall(argv[4] if len(argv) > 4 else "none", Path(f"{journal}.stalled"))
    if stall.kind == "save":
        stall_state_saves(stall)
    return asyncio.run(run(root, cfg, state_dir, journal, stall))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
