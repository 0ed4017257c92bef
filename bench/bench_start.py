"""Start -> READY and the daemon's import cost, vs a bare interpreter in the same run.

    .venv/bin/python bench/bench_start.py [-n 10] [--quick]

* start -> READY: Popen until READY=1 arrives on NOTIFY_SOCKET (systemd's side played
  here), interleaved with ``python3 -c pass`` (start to exit) so load hits all alike.
  - empty config: ``rdmad run`` itself (this host's kernel, read only), state and API
    socket in a temp dir;
  - 4 VFs + rxe: the daemon's wiring (its imports, the Agent, READY through the same
    notifier) over a fake sysfs tree (tests/support/fakesysfs.py: the mlx5 node with 4
    VFs, rdma_rxe loaded) and a config declaring the 4 VFs and one rxe link.
    ``rdmad run`` reads only "/", hence the small launcher; the pass, the plan and the
    READY are the real ones.
  - a GPU node (fake tree sized as the Ubuntu 24.04 GPU node of #61: the GPU driver
    loaded, no RDMA core, a /proc/kallsyms of 153,939 lines, a modules.dep of 6,000
    modules): nothing declared, and ``[peermem] mode = "auto"``; then the same with the
    RDMA core loaded, where auto's decision turns on the module tree and kallsyms (the
    one case that reads them). Each with the first pass's own time (the agent's).
* import cost: ``python -X importtime`` of what ``rdmad run`` imports before its first
  pass (rdmad.cli, rdmad.daemon) and of all it imports (the API and metrics too, which
  come in a worker thread once the first pass rests: rdmad.services), wall time vs
  ``python3 -c pass``; the top 10 modules of all by their own time (median of the
  runs). ``rich`` is hidden (sys.modules['rich'] = None) everywhere, ``rdmad run``
  included: only the dev tools install it, and structlog imports it when present; the
  package's dependencies do not include it.

Byte-code is compiled once first (an installed package has its .pyc files).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from headline import emit, median, pct, row  # noqa: E402

from tests.support.fakesysfs import MLX5_PF, RELEASE, gpu_node, mlx5_node  # noqa: E402

LAB = False
HIDE_RICH = "import sys; sys.modules['rich'] = None; "
# `rdmad run ARGS`, as the package's /usr/bin/rdmad runs it, with rich hidden: argv =
# [python, "-c", RUN_RDMAD, "run", ...] (bench_idle runs it too).
RUN_RDMAD = HIDE_RICH + "import runpy; runpy.run_module('rdmad.cli', run_name='__main__')"
DAEMON_IMPORTS = "import rdmad.nossl; rdmad.nossl.defer(); import rdmad.cli, rdmad.daemon"
# What rdmad.services imports in a worker thread once the first pass rests.
SERVICE_IMPORTS = DAEMON_IMPORTS + "; import rdmad.services as s; s.import_services()"

# The daemon's wiring over a fake root: argv = tree, config file.
FAKE_ROOT_DAEMON = r"""
import rdmad.nossl; rdmad.nossl.defer()  # as `rdmad run`: before asyncio
import asyncio, signal, sys
from pathlib import Path
import rdmad.cli, rdmad.daemon
from rdmad import config, services
from rdmad.agent import Agent, AgentOptions
from rdmad.clock import SystemClock
from rdmad.kernel.apply.host import KernelHost
from rdmad.triggers import TriggerQueue

async def main():
    clock = SystemClock()
    queue = TriggerQueue(clock)
    gate = services.ReadyGate(rdmad.daemon.SdNotifier())
    location = Path(sys.argv[2])
    settings = config.start_settings(location)  # as rdmad.daemon.serve: before the agent
    agent = Agent(KernelHost(sys.argv[1]), lambda: config.load(location), clock=clock,
                  queue=queue, notifier=gate, options=AgentOptions())
    early = services.EarlyChanges(agent.status)
    rdmad.daemon.freeze_startup_heap()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, agent.stop)
    # As rdmad.daemon.serve: the API and metrics once the first pass rests, READY=1 gated.
    starting = loop.create_task(
        services.start_services(location, settings, agent.status, queue, early, gate)
    )
    try:
        await agent.run()
    finally:
        await (await rdmad.daemon._stop_starting(starting)).close()
    print(f"FIRST_PASS_MS {agent.passes[0].seconds * 1000:.3f}", file=sys.stderr)

asyncio.run(main())
"""
KALLSYMS_LINES = 153_939  # the GPU node's /proc/kallsyms (#61)
MODULES = 6_000  # a distribution kernel's modules.dep (Ubuntu 24.04: ~6,000 modules)

VF_RXE_CONFIG = f"""
[[sriov]]
pf = {{ pci = "{MLX5_PF}" }}
numvfs = 4

[[rxe]]
name = "rxe0"
netdev = {{ name = "eth0" }}
"""


def gpu_tree(root: Path, *, rdma_core: bool) -> None:
    """A GPU node as the daemon reads it, its costly files at a real node's size."""
    loaded = ("nvidia", "ib_core") if rdma_core else ("nvidia",)
    symbols = tuple(f"sym_{i:06d}" for i in range(KALLSYMS_LINES - 2))
    fs = gpu_node(root, loaded=loaded, kallsyms=("ib_register_client", *symbols))
    base = f"lib/modules/{RELEASE}"
    deps = (root / base / "modules.dep").read_text().splitlines()
    deps += [
        f"kernel/drivers/misc/module_{i:04d}.ko.zst: kernel/lib/dep_{i % 97:02d}.ko.zst"
        for i in range(MODULES - len(deps))
    ]
    fs.write(f"{base}/modules.dep", "\n".join(deps))


GPU_CASES = {  # case -> (RDMA core loaded, config)
    "gpu_empty": (False, ""),
    "gpu_auto": (False, '[peermem]\nmode = "auto"\n'),
    "gpu_auto_rdma": (True, '[peermem]\nmode = "auto"\n'),
}


LABELS = {
    "bare": "python3 -c pass (start to exit)",
    "empty": "rdmad run, empty config",
    "vf_rxe": "4 VFs + rxe (fake tree)",
    "gpu_empty": "GPU node, nothing declared (fake tree)",
    "gpu_auto": "GPU node, peermem auto (fake tree)",
    "gpu_auto_rdma": "GPU node + RDMA core, peermem auto (fake tree)",
}


class Notify:
    """systemd's end of NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no READY=1 within {timeout} s")
            self.sock.settimeout(left)
            if b"READY=1" in self.sock.recv(65536):
                return

    def close(self) -> None:
        self.sock.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def to_ready(
    argv: list[str], env: dict[str, str], work: Path, first_pass: list[float] | None = None
) -> float:
    """ms from Popen to READY=1; the first pass's own ms (FIRST_PASS_MS on stderr, the
    fake-root launcher's) appended to ``first_pass`` when given."""
    notify = Notify(work / "notify.sock")
    env = dict(env, NOTIFY_SOCKET=str(notify.path))
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            notify.wait_ready()
            took = time.perf_counter() - t0
        except Exception:
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"{argv[:4]}: {err.decode()[-2000:]}") from None
        stop(proc)
        err = proc.stderr.read().decode() if proc.stderr is not None else ""
        if first_pass is not None:
            said = [ln for ln in err.splitlines() if ln.startswith("FIRST_PASS_MS ")]
            if not said:
                raise RuntimeError(f"{argv[:4]}: no first pass reported: {err[-2000:]}")
            first_pass.append(float(said[-1].split()[1]))
        return took * 1000
    finally:
        notify.close()
        (work / "notify.sock").unlink(missing_ok=True)


def wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def start_to_ready(
    n: int, work: Path, env: dict[str, str], passes: dict[str, list[float]]
) -> dict[str, list[float]]:
    """Start -> READY of each case, interleaved; the fake-root cases' first passes into
    ``passes``."""
    py = sys.executable
    empty = work / "etc-empty"
    empty.mkdir()
    (empty / "rdmad.toml").write_text(
        f'[daemon]\nstate_dir = "{work / "state"}"\n\n[api]\nsocket = "{work / "rdmad.sock"}"\n'
    )
    tree = work / "tree"
    mlx5_node(tree)
    cfg = work / "vf-rxe.toml"
    cfg.write_text(VF_RXE_CONFIG)
    cmds = {
        "bare": lambda: wall([py, "-c", "pass"], env),
        "empty": lambda: to_ready(
            [py, "-c", RUN_RDMAD, "run", "--config", str(empty), "--log-level", "warning"],
            env,
            work,
        ),
    }

    def fake_root(case: str, root: Path, config: Path) -> None:
        argv = [py, "-c", HIDE_RICH + FAKE_ROOT_DAEMON, str(root), str(config)]
        passes[case] = []
        cmds[case] = lambda: to_ready(argv, env, work, passes[case])

    fake_root("vf_rxe", tree, cfg)
    for case, (rdma_core, text) in GPU_CASES.items():
        gpu_tree(work / case, rdma_core=rdma_core)
        (work / f"{case}.toml").write_text(text)
        fake_root(case, work / case, work / f"{case}.toml")
    for fn in cmds.values():  # byte-code compiled, page cache warm
        fn()
    for got in passes.values():
        got.clear()  # the warm-up's
    out: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(n):
        for k, fn in cmds.items():
            out[k].append(fn())
    return out


def importtime(code: str, env: dict[str, str]) -> tuple[float, dict[str, int]]:
    """Wall ms of the process, and each module's own import time (us)."""
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    took = (time.perf_counter() - t0) * 1000
    own = {}
    for line in res.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cum, name = (p.strip() for p in line[len("import time:") :].split("|"))
        own[name] = int(self_us)
    return took, own


def imports(n: int, env: dict[str, str]) -> dict[str, Any]:
    importtime(HIDE_RICH + SERVICE_IMPORTS, env)  # compile
    walls: dict[str, list[float]] = {"bare": [], "daemon": [], "all": []}
    per_module: dict[str, list[int]] = defaultdict(list)
    for _ in range(n):
        walls["bare"].append(importtime("pass", env)[0])
        walls["daemon"].append(importtime(HIDE_RICH + DAEMON_IMPORTS, env)[0])
        took, own = importtime(HIDE_RICH + SERVICE_IMPORTS, env)
        walls["all"].append(took)
        for name, us in own.items():
            per_module[name].append(us)
    _, bare_own = importtime("pass", env)
    extra = {m: statistics.median(v) for m, v in per_module.items() if m not in bare_own}
    top = sorted(extra.items(), key=lambda kv: -kv[1])[:10]
    return {
        "wall_ms": walls,
        "modules": len(extra),
        "own_total_ms": sum(extra.values()) / 1000,
        "top10_ms": [(m, us / 1000) for m, us in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10, help="runs of each")
    ap.add_argument("--quick", action="store_true", help="one run of each (CI)")
    args = ap.parse_args()
    n = 1 if args.quick else args.n
    work = Path(tempfile.mkdtemp(prefix="rdmad-bench-start-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pyc")
    env["PYTHONPATH"] = str(REPO)
    passes: dict[str, list[float]] = {}
    try:
        ready = start_to_ready(n, work, env, passes)
        imp = imports(max(3, n), env)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    head = f"{'start -> READY':<48} {'p50 ms':>8} {'max ms':>8} {'first pass p50':>15} {'n':>4}"
    print(head)
    for k, label in LABELS.items():
        first = f"{median(passes[k]):>12.2f} ms" if passes.get(k) else f"{'-':>15}"
        print(
            f"{label:<48} {median(ready[k]):>8.1f} {max(ready[k]):>8.1f} {first} {len(ready[k]):>4}"
        )
    w = imp["wall_ms"]
    print(
        f"\nimports of rdmad run: {imp['modules']} modules beyond bare python, "
        f"{imp['own_total_ms']:.0f} ms of their own; process wall {median(w['all']):.0f} ms, "
        f"{median(w['daemon']):.0f} ms before the first pass, vs bare {median(w['bare']):.0f} ms"
    )
    print("top 10 by own import time:")
    for m, ms in imp["top10_ms"]:
        print(f"  {ms:>7.1f} ms  {m}")
    bare = "bare interpreter (python3 -c pass)"
    headline = [
        row(
            "start -> READY, empty config (p50)",
            median(ready["empty"]),
            median(ready["bare"]),
            bare,
        ),
        row(
            "start -> READY, empty config (max)", max(ready["empty"]), pct(ready["bare"], 100), bare
        ),
        row(
            "start -> READY, 4 VFs + rxe, fake tree (p50)",
            median(ready["vf_rxe"]),
            median(ready["bare"]),
            bare,
        ),
        row(
            "start -> READY, GPU node, nothing declared (p50)",
            median(ready["gpu_empty"]),
            median(ready["bare"]),
            bare,
        ),
        row(
            "first pass, GPU node, peermem auto (p50)",
            median(passes["gpu_auto"]),
            median(passes["gpu_auto_rdma"]),
            "the same pass with the RDMA core loaded (the module tree and kallsyms read)",
        ),
        row(
            "import before the first pass: rdmad.cli + rdmad.daemon (wall p50)",
            median(w["daemon"]),
            median(w["bare"]),
            bare,
        ),
        row(
            "import of all, the API and metrics too (wall p50)",
            median(w["all"]),
            median(w["bare"]),
            bare,
        ),
    ]
    emit("start", headline, start_to_ready_ms=ready, first_pass_ms=passes, imports=imp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
