"""What the daemon's imports load: no pyroute2 in the kernel layer (rdmad speaks netlink
itself); no aiohttp or prometheus_client before the first pass (rdmad.services imports
them in a thread once it rests), nor ssl (rdmad.nossl); which value types cost start-up
as dataclasses."""

from __future__ import annotations

import ast
import subprocess
import sys


def _loaded(imports: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` a fresh interpreter holds after ``imports`` (a name
    marked absent, ``None`` in ``sys.modules``, is not one)."""
    code = (
        "import sys\n"
        f"{imports}\n"
        f"print(sorted(m for m, mod in sys.modules.items()\n"
        f"             if m.startswith({packages!r}) and mod is not None))\n"
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


def test_rdmad_run_reaches_its_first_pass_without_ssl_and_its_services_load_it() -> None:
    # `rdmad run` marks ssl absent before asyncio's import (rdmad.nossl): asyncio then
    # runs without it (libssl and libcrypto unread); the services' import lifts the mark.
    imports = (
        "from rdmad import nossl\n"
        "assert nossl.defer()\n"
        "import rdmad.cli, rdmad.daemon, rdmad.services\n"
        "import rdmad.kernel.apply.host, rdmad.kernel.apply.dryrun\n"
        "import rdmad.kernel.events.udev, rdmad.kernel.events.linkevents"
    )
    assert _loaded(imports, ("ssl", "_ssl", "aiohttp")) == []
    # A loop without ssl serves and answers a UNIX socket, as the daemon's API does.
    echo = (
        "\nimport asyncio, os, tempfile\n"
        "async def main():\n"
        "    path = os.path.join(tempfile.mkdtemp(), 's')\n"
        "    async def serve(r, w):\n"
        "        w.write(await r.readline()); await w.drain(); w.close()\n"
        "    server = await asyncio.start_unix_server(serve, path)\n"
        "    r, w = await asyncio.open_unix_connection(path)\n"
        "    w.write(b'ping\\n'); await w.drain()\n"
        "    assert await r.readline() == b'ping\\n'\n"
        "    w.close(); server.close()\n"
        "asyncio.run(main())"
    )
    assert _loaded(imports + echo, ("ssl", "_ssl")) == []
    after = _loaded(
        imports + "\nimport rdmad.services as s; s.import_services()",
        ("ssl", "_ssl", "aiohttp", "prometheus_client"),
    )
    assert {"ssl", "_ssl", "aiohttp", "prometheus_client"} <= set(after)


def test_nossl_leaves_an_imported_ssl_alone() -> None:
    code = "import ssl\nfrom rdmad import nossl\nassert not nossl.defer()\nnossl.allow()"
    assert _loaded(code, ("ssl",)) == ["ssl"]


def test_check_config_loads_neither_the_planner_nor_the_kernel_layer() -> None:
    # `rdmad check-config` is the unit's ExecReload (every `systemctl reload`) and the
    # Ansible role's validate step: it parses and validates, nothing more.
    heavy = ("rdmad.reconcile", "rdmad.kernel", "rdmad.status", "rdmad.agent", "structlog")
    assert _loaded("import rdmad.cli", heavy) == []
    assert _loaded("import rdmad.cli", ("asyncio",)) == []


# The dataclasses the daemon defines before its first pass, each ~0.3 ms of start-up
# (a Struct ~1/30 of that, a named tuple ~1/7): the guard's values and the facts it
# must compare or replace with the standard library alone (README, "Value types").
STANDARD_LIBRARY_DATACLASSES = {
    "rdmad.model.shared_observed": {
        "Usage",
        "RdmaLinkObserved",
        "PauseObserved",
        "OpenibdObserved",
        "GuardHookObserved",
    },
    "rdmad.model.observed": {"UnsupportedKey"},  # a field left out of comparisons
    "rdmad.managers.facts": {"PfManagers"},
    "rdmad.peermem.facts": {"PeermemFacts"},
    "rdmad.peermem.choice": {"Held"},  # a field left out of comparisons
    "rdmad.kernel.usage.holders": {"OpenFiles", "Libvirt"},  # filled as they are read
    "rdmad.kernel.netlink.devlink_codec": {"Port"},  # a field named index
    "rdmad.kernel.netlink.rdma": {"_Seen"},  # a field named index
    "rdmad.kernel.events.reflex": {"Firing"},  # changes as the kernel answers
}


def test_before_the_first_pass_only_the_standard_library_values_are_dataclasses() -> None:
    code = (
        "import dataclasses, sys\n"
        "import rdmad.cli, rdmad.daemon, rdmad.services\n"
        "import rdmad.kernel.apply.host, rdmad.kernel.apply.dryrun\n"
        "import rdmad.kernel.events.udev, rdmad.kernel.events.linkevents\n"
        "import rdmad.kernel.events.uevents, rdmad.kernel.events.reflex\n"
        "from rdmad.model import Observed, PlanState, Desired, Action\n"
        "found = {}\n"
        "for name, mod in list(sys.modules.items()):\n"
        "    if name.startswith('rdmad'):\n"
        "        for attr, value in vars(mod).items():\n"
        "            if (isinstance(value, type) and value.__module__ == name\n"
        "                    and dataclasses.is_dataclass(value)):\n"
        "                found.setdefault(name, set()).add(attr)\n"
        "print(repr(found))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    found = ast.literal_eval(out.stdout.strip())
    assert found == STANDARD_LIBRARY_DATACLASSES
