"""Issue #23 on a real 6.1 kernel: rdmad loads the (dummy) nvidia-peermem when the GPU
driver and the RDMA core are both there, again after an RDMA stack restart, and when
module loading is disabled says so without retrying.

The image's dummy ``nvidia-peermem`` depends on ``ib_core`` and ``nvidia`` (LAB.md)
and does not use the peer-memory API, so an inbox 6.1 ib_core can load it. rdmad runs
as the systemd service; the drift timer cannot fire in (a) and (b), so whatever loads
peermem there is an event.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
from harness import Guest, install_rdmad, log
from service import (
    DEBUG_LOG,
    ctl,
    ctl_status,
    history,
    history_entries,
    start,
    wait_passes,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

EVENT_DEADLINE = 30.0  # bound of a wait, not a measurement (bench/bench_peermem.py measures)
LOADED = "grep -q '^nvidia_peermem ' /proc/modules"
# The RDMA stack as openibd stops it: peermem first (it holds ib_core), then ib_core's
# other holders, then ib_core. Retried (bounded) because rdmad may reload peermem
# between the steps: that is the very race this feature is about. peermem goes with
# rmmod: `modprobe -r` would also unload the dummy nvidia as an unused dependency,
# which a real GPU driver (held by nvidia_uvm, nvidia_modeset, processes) never is.
STACK_STOP = """
for i in $(seq 1 20); do
  rmmod nvidia_peermem 2>/dev/null
  for m in $(ls /sys/module/ib_core/holders 2>/dev/null); do modprobe -r "$m" 2>/dev/null; done
  modprobe -r ib_core 2>/dev/null
  [ -e /sys/module/ib_core ] || exit 0
done
echo "ib_core still loaded: $(ls /sys/module/ib_core/holders)" >&2
exit 1
"""


def config(mode: str, drift: str = "1h") -> str:
    return "\n".join(
        [
            "[daemon]",
            f'drift_interval = "{drift}"',
            'settle = "150ms"',
            DEBUG_LOG,
            "",
            "[peermem]",
            f'mode = "{mode}"',
            "",
        ]
    )


def peermem_entries(g: Guest, event: str) -> list[dict[str, Any]]:
    return [h for h in history(g) if h.get("obj") == "peermem" and h["event"] == event]


def peermem_status(g: Guest) -> dict[str, Any]:
    _, doc = ctl_status(g)
    [obj] = [o for o in doc["objects"] if o["obj"] == "peermem"]
    return obj


def doctor(g: Guest, path: str | None = None) -> dict[str, Any]:
    """`rdmad-ctl doctor --json` in the guest (exit 0 or 1), optionally with another PATH."""
    env = f"env PATH={path} " if path else ""
    exe = g.check("command -v rdmad-ctl").strip()
    res = g.run(f"{env}{exe} doctor --json", timeout=120)
    assert res.rc in (0, 1), res.describe()
    doc: dict[str, Any] = json.loads(res.out)
    assert doc["blocking"] is (res.rc == 1), res.describe()
    return doc


def check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in doc["checks"] if c["check"] == name]
    return found


@pytest.fixture
def rdmad(guest: Guest) -> Guest:
    report = guest.install_rdmad()
    assert report.unit_installed
    guest.run("rm -rf /etc/rdmad /var/lib/rdmad; modprobe -r nvidia_peermem nvidia; true")
    return guest


def test_nvidia_arriving_loads_peermem_and_a_stack_restart_brings_it_back(rdmad: Guest) -> None:
    g = rdmad
    g.check("modprobe ib_core")
    start(g, config("auto"))
    assert not g.module_loaded("nvidia_peermem")  # no GPU driver yet: not needed

    # (a) The GPU driver arrives: its udev module event makes rdmad load peermem.
    g.check("modprobe nvidia")
    g.wait_for(LOADED, timeout=EVENT_DEADLINE)
    [first] = history_entries(g, lambda h: h.get("obj") == "peermem" and h["event"] == "applied")
    assert "modprobe nvidia-peermem" in first["what"] or "nvidia-peermem" in first["what"], first
    assert "drift" not in first["cause"], first
    status = peermem_status(g)
    assert status["state"] == "converged", status
    doc = doctor(g)
    assert check(doc, "peermem")["status"] == "ok", doc
    assert check(doc, "module-loading")["status"] == "ok", doc

    # (b) An RDMA stack restart unloads peermem with ib_core; ib_core back -> peermem back.
    g.check(STACK_STOP, timeout=180)
    assert not g.module_loaded("nvidia_peermem")
    assert g.module_loaded("nvidia")
    g.check("modprobe ib_core")
    g.wait_for(LOADED, timeout=EVENT_DEADLINE)
    loads = history_entries(
        g, lambda h: h.get("obj") == "peermem" and h["event"] == "applied", count=2
    )
    assert all("drift" not in h["cause"] for h in loads), loads
    assert peermem_entries(g, "failed") == []


# In the guest, with rdmad's python: a pass's peer-memory facts in auto mode (the probe
# the daemon uses) and the doctor's (every symbol), each file they read, and what the
# kernel itself says: which module /proc/kallsyms names for the DMA-BUF function.
FACTS_SCRIPT = textwrap.dedent(
    """
    import json, time
    from rdmad.kernel.peermem_probe import PeermemProbe
    from rdmad.kernel.sysfs import Sysfs
    from rdmad.peermem.choice import decide
    from rdmad.peermem.facts import gather
    from rdmad.peermem.names import DMABUF_SYMBOL

    class Counting(Sysfs):
        def __init__(self):
            super().__init__("/")
            self.bytes_read = []
        def read_bytes(self, rel):
            self.bytes_read.append(rel)
            return super().read_bytes(rel)

    def timed(fn):
        started = time.perf_counter()
        out = fn()
        return out, round((time.perf_counter() - started) * 1000, 1)

    fs = Counting()
    facts, pass_ms = timed(lambda: PeermemProbe().facts(fs, "auto"))
    doctor, doctor_ms = timed(lambda: gather(Sysfs("/"), full=True))
    kallsyms, kallsyms_ms = timed(lambda: open("/proc/kallsyms", "rb").read())
    line = next(l for l in kallsyms.splitlines() if l.split()[2:3] == [DMABUF_SYMBOL.encode()])
    print(json.dumps({
        "pass": {"dmabuf": facts.dmabuf_symbol, "open_gpu": facts.open_gpu_modules,
                 "read": fs.bytes_read, "ms": pass_ms,
                 "findings": [f.id for f in decide("auto", facts).findings]},
        "doctor": {"dmabuf": doctor.dmabuf_symbol, "ms": doctor_ms,
                   "findings": [f.id for f in decide("auto", doctor).findings]},
        "kallsyms": {"line": line.decode(), "ms": kallsyms_ms},
    }))
    """
)


def test_a_pass_finds_the_dmabuf_function_in_ib_uverbs_btf_not_kallsyms(guest: Guest) -> None:
    """6.1 with the RDMA core and the (dummy, GPL: "open") GPU driver, as a GPU node with
    the open modules: DMA-BUF is there, and a pass learns it from ib_uverbs' BTF, not from
    /proc/kallsyms (the kernel formats all of it as it is read, 0.6 s in this guest).
    The doctor, who reads every symbol, comes to the same facts and findings."""
    g = guest
    g.check("modprobe nvidia && modprobe rdma_rxe")  # rdma_rxe brings ib_core and ib_uverbs
    python = install_rdmad(g)
    res = g.run([python, "-c", FACTS_SCRIPT], timeout=300)
    assert res.rc == 0, res.describe()
    got = json.loads(res.out.strip().splitlines()[-1])
    log(f"peermem facts in the guest: {json.dumps(got)}")
    assert got["kallsyms"]["line"].endswith("[ib_uverbs]"), got  # where the kernel has it
    one_pass = got["pass"]
    assert one_pass["open_gpu"] is True and one_pass["dmabuf"] is True, got
    assert "sys/kernel/btf/ib_uverbs" in one_pass["read"], got
    assert "proc/kallsyms" not in one_pass["read"], got
    assert got["doctor"]["dmabuf"] is True, got
    assert "dmabuf-available" in one_pass["findings"], got
    assert one_pass["findings"] == got["doctor"]["findings"], got


def test_modules_disabled_is_reported_and_not_retried(installed_guest: Guest) -> None:
    """(c) modules_disabled = 1 (until reboot: a guest of its own): the finding is in
    status, and rdmad's next drift passes run no modprobe at all."""
    g = installed_guest
    assert g.install_rdmad().unit_installed
    g.check("modprobe ib_core && modprobe nvidia")
    g.check("echo 1 > /proc/sys/kernel/modules_disabled")
    start(g, config("auto", drift="2s"))
    wait_passes(g, 5)  # rdmad's own record of five more full passes
    status = peermem_status(g)
    assert status["state"] == "blocked", status
    assert "modules-disabled" in status["reason"], status
    attempts = peermem_entries(g, "applied") + peermem_entries(g, "failed")
    assert attempts == [], attempts  # not even a first: the finding comes before modprobe
    assert not g.module_loaded("nvidia_peermem")
    table = ctl(g, "status")
    assert "modules-disabled" in table.out, table.describe()
    # The doctor, without the daemon and without any tool in PATH, says the same.
    g.check("systemctl stop rdmad.service", timeout=360)
    doc = doctor(g, path="/nonexistent")
    assert doc["blocking"] is True, doc
    peer = check(doc, "peermem")
    assert peer["status"] == "fail", peer
    assert peer["findings"][0]["id"] == "modules-disabled", peer
    assert check(doc, "module-loading")["status"] == "warn", doc


UNKNOWN_SYMBOL_KO = "/usr/local/share/rdmad-lab/nvidia-peermem-unknown-symbol.ko"
PEERMEM_KO = "/lib/modules/$(uname -r)/extra/nvidia-peermem.ko"


def test_a_failed_load_is_explained_from_the_kernel_log_under_the_unit(rdmad: Guest) -> None:
    """(d) A peermem whose load fails on a symbol nothing exports: modprobe only says
    "Unknown symbol in module, or unknown parameter"; the kernel log names the symbol.
    rdmad, as the shipped unit (PrivateDevices= with /dev/kmsg bound back, CAP_SYSLOG
    under Debian's dmesg_restrict), reads it and says which symbol."""
    g = rdmad
    assert g.read("/proc/sys/kernel/dmesg_restrict") == "1"  # reading needs CAP_SYSLOG
    g.check(
        f"cp {PEERMEM_KO} /run/lab-peermem.ko && cp {UNKNOWN_SYMBOL_KO} {PEERMEM_KO} "
        "&& depmod -a 2>/dev/null"
    )
    try:
        g.check("modprobe ib_core && modprobe nvidia")
        start(g, config("auto"))
        failed = history_entries(g, lambda h: h.get("obj") == "peermem" and h["event"] == "failed")[
            -1
        ]
        status = peermem_status(g)
        assert status["state"] == "blocked", status
        assert "unknown-symbol" in status["reason"], status
        # The evidence is the kernel's line, not modprobe's lumped one.
        assert "Unknown symbol nvidia_lab_missing_symbol" in status["reason"], status
        assert not g.module_loaded("nvidia_peermem")
        print(f"failed load: {failed['what']!r}; status: {status['reason']!r}")
    finally:
        g.run(f"cp /run/lab-peermem.ko {PEERMEM_KO} && depmod -a", timeout=120)
