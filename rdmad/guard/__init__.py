"""The driver guard: may a module be unloaded, or would that hurt a VF or RDMA link in use?

Standalone: it runs inside `modprobe -r` (the modprobe.d hook rdmad writes), from the
openibd drop-in and as `rdmad-ctl guard check`, with the daemon up or down. It decides
from the kernel directly with the planner's own usage detection (``rdmad.kernel.usage.holders``),
imports no config schema (msgspec), pyroute2, aiohttp or structlog (a contract in
pyproject.toml), and never hangs: a hard deadline refuses (unless forced) rather than
keep modprobe waiting.

* ``decide``: the decision, pure over a ``Sysfs`` and the RDMA links;
* ``caller``: who asked (the process chain above the hook), for the journal;
* ``cli``: the command line, the deadline, the journal, the pause.
"""
