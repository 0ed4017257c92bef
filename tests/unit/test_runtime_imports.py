"""What the daemon's imports load: no pyroute2 in the kernel layer (rdmad speaks netlink
itself); no aiohttp or prometheus_client before the first pass (rdmad.services imports
them in a thread beside it)."""

from __future__ import annotations

import ast
import subprocess
import sys


def _loaded(imports: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` a fresh interpreter holds after ``imports``."""
    code = (
        "import sys\n"
        f"{imports}\n"
        f"print(sorted(m for m in sys.modules if m.startswith({packages!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return list(ast.literal_eval(out.stdout.strip()))


def test_kernel_layer_imports_without_pyroute2() -> None:
    imports = (
        "import rdmad.kernel.apply.host, rdmad.kernel.netlink.rdma\n"
        "import rdmad.kernel.events.linkevents, rdmad.kernel.netlink.rtnetlink"
    )
    assert _loaded(imports, ("pyroute2",)) == []


def test_the_daemon_reaches_its_first_pass_without_the_web_and_metrics_libraries() -> None:
    # Everything `rdmad run` imports before the agent's first pass: the CLI, the daemon
    # wiring, the kernel host and the event sources it builds.
    imports = (
        "import rdmad.cli, rdmad.daemon, rdmad.services\n"
        "import rdmad.kernel.apply.host, rdmad.kernel.apply.dryrun\n"
        "import rdmad.kernel.events.udev, rdmad.kernel.events.linkevents"
    )
    assert _loaded(imports, ("aiohttp", "prometheus_client", "rdmad.api")) == []
    # ... and what the worker thread then imports is all of it.
    after = _loaded(
        imports + "\nimport rdmad.services as s; s.import_services()",
        ("aiohttp", "prometheus_client", "rdmad.api"),
    )
    assert {"aiohttp", "prometheus_client", "rdmad.api", "rdmad.api.metrics"} <= set(after)


def test_check_config_loads_neither_the_planner_nor_the_kernel_layer() -> None:
    # `rdmad check-config` is the unit's ExecReload (every `systemctl reload`) and the
    # Ansible role's validate step: it parses and validates, nothing more.
    heavy = ("rdmad.reconcile", "rdmad.kernel", "rdmad.status", "rdmad.agent", "structlog")
    assert _loaded("import rdmad.cli", heavy) == []
    assert _loaded("import rdmad.cli", ("asyncio",)) == []
