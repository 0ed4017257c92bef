"""A real-clock agent under a fault that never clears, for CPU figures.

``python -m tests.reliability.fault_worker STATE_DIR SECONDS`` runs the agent with
one rxe link whose creation always fails with EBUSY (and one that converges) for
SECONDS of wall time, then prints one JSON line: CPU seconds used, passes, attempts.
"""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import sys
from pathlib import Path

from rdmad.agent import Agent, AgentOptions
from rdmad.clock import SystemClock
from rdmad.state import StateStore
from tests.agent.conftest import ConfigBox, FakeHost, Notes, desired


async def main(state_dir: Path, seconds: float) -> dict[str, float]:
    host = FakeHost(fail={"rxe0": errno.EBUSY})
    agent = Agent(
        host,
        ConfigBox(desired(("rxe0", "eth0"), ("rxe1", "eth1"))),
        clock=SystemClock(),
        notifier=Notes(),
        state_store=StateStore(state_dir),
        boot_id="boot-1",
        options=AgentOptions(),
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    task = asyncio.get_running_loop().create_task(agent.run())
    await asyncio.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    agent.stop()
    await asyncio.wait_for(task, 10)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "seconds": seconds,
        "cpu_seconds": round(cpu, 3),
        "cpu_percent": round(100 * cpu / seconds, 2),
        "passes": len(agent.passes),
        "attempts": sum(1 for a in host.applied if getattr(a, "name", "") == "rxe0"),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))))
