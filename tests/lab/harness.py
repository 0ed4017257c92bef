"""QEMU/TCG lab harness: boot the lab guest, drive it through the guest agent.

Standard library only. One QEMU process per `Guest`; every process is killed
by pid (explicitly, at interpreter exit, and by the kernel through
PR_SET_PDEATHSIG when the Python process dies), so no test leaves a QEMU
behind. See tests/lab/README.md for how the image is built and cached.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import fcntl
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvh import pvh_kernel
from states import StateCache, file_digest, state_key

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "lab" / "image" / "build.sh"
QEMU = "qemu-system-x86_64"
ENABLE_HINT = "run scripts/lab-deps.sh && scripts/lab-image.sh as root"
# The whole line must be there: the serial log is read while QEMU writes it, and a
# half-written boot_id would look like a new boot.
BOOT_MARKER = re.compile(rb"RDMAD-LAB-BOOT-DONE boot=(\d+) boot_id=([0-9a-f-]{36}) uptime=")
# What a guest kernel prints when its CPUs stop getting time: the RCU stall detector's
# reports. With a silent guest agent they mean a frozen emulator (see GuestFrozen).
KERNEL_STALL = re.compile(rb"rcu: INFO: rcu_\w+ (?:self-)?detected stalls|rcu_\w+ kthread starved")
# What it prints when one task held a CPU in the kernel for over 20 s: a kernel or
# driver hang, and a finding, whatever else the log says (see GuestKernelHang).
KERNEL_LOCKUP = re.compile(rb"watchdog: BUG: soft lockup")
# KERNEL_BANNER starts each boot in the serial log.
KERNEL_BANNER = b"Linux version "
# The agent's longest silence a live guest has shown under TCG is 30 s; past this, the
# guest is taken as stopped whatever the command's own deadline (see GuestAgent.exec).
AGENT_SILENCE_LIMIT = 150.0
GUEST_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
VENV = "/opt/rdmad/venv"
SRC_MOUNT = "/mnt/src"
INSTALL_DIR = "/opt/rdmad/src"
# How install_rdmad() puts rdmad into a guest: "package" (the default, what CI and
# users get: the .deb built from this tree, installed with apt) or "source" (a copy
# of rdmad/ into the image's venv: seconds, for iterating on the code).
INSTALL_MODE_ENV = "RDMAD_LAB_INSTALL"
BUILD_DEB = REPO_ROOT / "scripts" / "build-deb.sh"
# The guest's Debian release, read by image/build.sh too: bookworm (the lab's own) or
# trixie (the Debian 13 guest of `make test-debian13-lab`), and the package target
# (packaging/targets.toml) each one installs.
SUITE_ENV = "RDMAD_LAB_SUITE"
DEB_TARGETS = {"bookworm": "debian12", "trixie": "debian13"}
PACKAGE_PYTHON = "/usr/lib/rdmad/bin/python3"
GUEST_DEB_DIR = "/var/cache/rdmad-lab-debs"
WORKDIR_PREFIX = "rdmad-lab-"
# "0": every guest boots; otherwise a pool boots one guest, saves it (SavedBoot) and
# starts every guest from that, in ~1 s instead of a 40-55 s boot under TCG.
SAVED_BOOT_ENV = "RDMAD_LAB_SAVED_BOOT"
# Saving or loading the ~200 MB migration stream takes 1-2 s on a loaded host.
MIGRATION_TIMEOUT = 120.0
# Waits poll often at first (most conditions hold within a second or two), then less:
# each poll forks commands in the TCG guest, and polling every 0.1 s cost 27-36% of a
# host core for as long as the wait lasted (0.5 s: 13%, idle 9%; measured 2026-11-28),
# taken from rdmad in that guest and from the other worker's guest.
FAST_POLL = 2.0
SLOW_POLL = 0.5

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIVE_QEMUS: dict[int, subprocess.Popen[bytes]] = {}


def log(message: str) -> None:
    """Progress on stderr: boots take tens of seconds, so say what is going on."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # several guests at once: whose line
    who = f"lab {worker}" if worker else "lab"
    print(f"[{who} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class LabError(Exception):
    """The lab itself failed (boot, agent, timeout): not an assertion on rdmad."""


class GuestTimeout(LabError):
    pass


class GuestAgentSilent(GuestTimeout):
    """The guest agent stopped answering (not: a command ran past its deadline)."""


class GuestFrozen(GuestTimeout):
    """The guest kernel reported an RCU stall, none of its CPUs a soft lockup, and its
    agent went silent: the emulator starved the vCPUs (seen in CI under TCG on 2 host
    cores: an RCU stall, then nothing for minutes). An emulator fault, not a finding
    about rdmad: conftest runs a test whose first failure this is once more, on a
    fresh guest, and the run's summary says so.

    ``met`` is the exception the caller was already handling when the guest froze (a
    test that failed an assertion and then asked the guest for its status): then the
    freeze is not the test's first failure and is not rerun.
    """

    def __init__(self, message: str, met: BaseException | None = None) -> None:
        if met is not None:
            message += f" (after an earlier failure: {type(met).__name__}: {met})"
        super().__init__(message)
        self.met = met


class GuestKernelHang(GuestTimeout):
    """The guest agent went silent (or a boot never ended) and the guest kernel reports
    a soft lockup: a task held a CPU in the kernel for over 20 s. A failure, never
    taken for an emulator freeze, so never rerun.

    Why the two are told apart this way: a starved emulator stops every vCPU at once,
    so the RCU grace-period kthread gets no time and the stall detector speaks (CI's
    freezes said "rcu_preempt kthread starved"), but no task was running in the guest
    kernel. A soft lockup names the task that held the CPU (``[modprobe:312]``): a
    driver probe, a module init or a kernel path rdmad drove looping there, and its RCU
    stall reports follow from it. A long host stall can print a soft lockup too; that
    run fails and the log says so, which costs a look, where a rerun could hide a hang
    rdmad caused."""


class GuestBootStuck(GuestTimeout):
    """A boot that never printed its boot-done marker, with no kernel stall reported
    (seen once in CI: a login prompt after 30 s, then no marker for 270 s). The message
    carries what systemd still waited for. Benchmarks run once more on a new guest
    (``lab_script_exit``); lab tests do not: a boot rdmad holds up is a finding."""


# --------------------------------------------------------------------------
# Prerequisites and the image


@dataclass(frozen=True)
class LabImage:
    directory: Path

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def boot_kernel(self) -> Path:
        """What QEMU loads: vmlinux through the PVH entry where the kernel has one
        (no decompression under TCG, ~7 s less per boot: pvh.py), else vmlinuz."""
        return pvh_kernel(self.kernel) or self.kernel

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs.img"


def find_image() -> LabImage | None:
    """The cached image for the current inputs (build.sh computes the key)."""
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    image = LabImage(Path(proc.stdout.strip().splitlines()[-1]))
    ok = all(p.is_file() for p in (image.kernel, image.initrd, image.rootfs))
    return image if ok else None


@functools.cache
def qemu_version() -> str:
    """QEMU's version line (a saved state is QEMU's own format: keyed by it)."""
    proc = subprocess.run(
        [QEMU, "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout.splitlines()[0].strip()


def qemu_has_igb() -> bool:
    try:
        proc = subprocess.run(
            [QEMU, "-device", "help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return '"igb"' in proc.stdout


def install_mode() -> str:
    mode = os.environ.get(INSTALL_MODE_ENV, "package")
    if mode not in ("package", "source"):
        raise LabError(f"{INSTALL_MODE_ENV}={mode!r}: use 'package' or 'source'")
    return mode


def deb_target() -> str:
    """The packaging/targets.toml release whose .deb the lab guest installs."""
    suite = os.environ.get(SUITE_ENV, "bookworm")
    if suite not in DEB_TARGETS:
        raise LabError(f"{SUITE_ENV}={suite!r}: use one of {', '.join(DEB_TARGETS)}")
    return DEB_TARGETS[suite]


_DEBS: dict[str, Path] = {}


def build_deb(version: str | None = None) -> Path:
    """The .deb of this tree (scripts/build-deb.sh, cached by a hash of its inputs).

    Built at most once per version per session; the result lies under dist/, which
    the guest sees through the 9p share. Lab workers running at once (pytest-xdist)
    build one at a time (a lock file under dist/): the second finds the first's in the
    cache.
    """
    key = version or ""
    if key not in _DEBS:
        argv = ["bash", str(BUILD_DEB), "--target", deb_target()]
        argv += ["--version", version] if version else []
        log(f"building the {deb_target()} .deb{f' {version}' if version else ''} (cached)")
        lock = REPO_ROOT / "dist" / ".lab-build.lock"
        lock.parent.mkdir(exist_ok=True)
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
        if proc.returncode != 0:
            raise LabError(f"scripts/build-deb.sh failed:\n{proc.stderr[-4000:]}")
        deb = Path(proc.stdout.strip().splitlines()[-1])
        if REPO_ROOT not in deb.resolve().parents:
            raise LabError(f"{deb}: not under {REPO_ROOT}, so not in the guest's 9p share")
        _DEBS[key] = deb
    return _DEBS[key]


def missing_prerequisite() -> str | None:
    """Why the lab cannot run here, or None. The reason says how to fix it."""
    if not sys.platform.startswith("linux"):
        return "the lab needs a Linux host"
    if shutil.which(QEMU) is None:
        return f"{QEMU} not found ({ENABLE_HINT})"
    if os.geteuid() != 0:
        return f"the lab runs as root ({ENABLE_HINT}, then run pytest as root)"
    if not qemu_has_igb():
        return f"{QEMU} has no igb device: QEMU >= 8 is needed ({ENABLE_HINT})"
    if find_image() is None:
        return f"the lab guest image for the current inputs is not built ({ENABLE_HINT})"
    for tool in ("dpkg-buildpackage", "dh"):
        if shutil.which(tool) is None:
            return (
                f"{tool} not found: the lab installs rdmad from its .deb "
                "(run scripts/pkg-deps.sh as root)"
            )
    return None


# --------------------------------------------------------------------------
# Guest agent client (QGA JSON protocol over the virtio-serial unix socket)


@dataclass(frozen=True)
class ExecResult:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    # subprocess.CompletedProcess spellings, for tests written against those.
    @property
    def returncode(self) -> int:
        return self.rc

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err

    def describe(self) -> str:
        return f"rc={self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class GuestAgent:
    """A minimal QGA client.

    Every request carries an id and answers with other ids are dropped: after
    a timeout or a guest reboot, stale answers may still arrive on the socket.
    """

    what = "the guest agent"

    def __init__(self, path: Path) -> None:
        self._path = path
        self._sock: socket.socket | None = None
        self._buf = b""
        self._next_id = int(time.time() * 1000) % 1_000_000

    def close(self) -> None:
        if self._sock is not None:
            with suppress(OSError):
                self._sock.close()
        self._sock = None
        self._buf = b""

    def _connect(self, deadline: float) -> socket.socket:
        while self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self._path))
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise GuestTimeout(f"cannot connect to {self.what} at {self._path}") from exc
                time.sleep(0.1)
                continue
            self._sock = sock
        return self._sock

    def _send(self, message: dict[str, Any], deadline: float) -> None:
        sock = self._connect(deadline)
        try:
            sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:  # EPIPE: the other end closed it, as an empty read says
            self.close()
            raise LabError(f"{self.what}'s socket closed (QEMU gone?): {exc}") from exc

    def _read_line(self, deadline: float) -> bytes:
        sock = self._connect(deadline)
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GuestAgentSilent(f"{self.what} did not answer in time")
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except TimeoutError as exc:
                raise GuestAgentSilent(f"{self.what} did not answer in time") from exc
            if not chunk:
                self.close()
                raise LabError(f"{self.what}'s socket closed (QEMU gone?)")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        # guest-sync-delimited answers are preceded by 0xFF; drop it.
        return line.replace(b"\xff", b"").strip()

    def call(
        self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> Any:
        deadline = time.monotonic() + timeout
        self._next_id += 1
        req_id = self._next_id
        message: dict[str, Any] = {"execute": command, "id": req_id}
        if arguments is not None:
            message["arguments"] = arguments
        self._send(message, deadline)
        while True:
            line = self._read_line(deadline)
            if not line:
                continue
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # garbage from a guest agent that restarted mid-line
            if answer.get("id") != req_id:
                continue
            if "error" in answer:
                raise LabError(f"{self.what}: {command}: {answer['error']}")
            return answer.get("return")

    def sync(self, timeout: float) -> None:
        """Wait until the agent answers (it may still be starting)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._next_id += 1
                token = self._next_id
                got = self.call(
                    "guest-sync-delimited",
                    {"id": token},
                    timeout=min(3.0, max(0.1, deadline - time.monotonic())),
                )
                if got == token:
                    return
            except GuestTimeout:
                if time.monotonic() > deadline:
                    raise
            except LabError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def exec(self, argv: list[str], *, timeout: float, stdin: bytes | None = None) -> ExecResult:
        """Run argv in the guest, wait (bounded) and return its exit code and output."""
        deadline = time.monotonic() + timeout
        args: dict[str, Any] = {
            "path": argv[0],
            "arg": argv[1:],
            "env": GUEST_ENV,
            "capture-output": True,
        }
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        pid = self.call("guest-exec", args, timeout=min(30.0, timeout))["pid"]
        interval = 0.02
        silent_since: float | None = None
        while True:
            asked = time.monotonic()
            try:
                status = self.call("guest-exec-status", {"pid": pid}, timeout=30.0)
            except GuestTimeout:
                # The agent stalled (seen once under TCG: 30 s without an answer while the
                # command ran on). Its late answer carries an old id and is skipped; ask
                # again until the command's own deadline or AGENT_SILENCE_LIMIT of silence,
                # whichever comes first: a guest the emulator froze never answers again,
                # and a long command's deadline (hours for a benchmark) is no bound then.
                # Silence is counted from the first unanswered request, not from when
                # its wait ended (30 s later).
                now = time.monotonic()
                silent_since = asked if silent_since is None else silent_since
                if now > deadline:
                    raise
                if now - silent_since >= AGENT_SILENCE_LIMIT:
                    raise GuestAgentSilent(
                        f"the guest agent did not answer for {now - silent_since:.0f} s "
                        f"while {argv[0]} ran"
                    ) from None
                log(f"guest agent: no guest-exec-status answer in 30 s; asking again ({argv[0]})")
                continue
            silent_since = None
            if status.get("exited"):
                return _exec_result(status)
            if time.monotonic() > deadline:
                with suppress(LabError):
                    self.call("guest-exec", {"path": "/bin/kill", "arg": ["-9", str(pid)]})
                raise GuestTimeout(f"guest command timed out after {timeout:.0f} s: {argv}")
            time.sleep(interval)
            interval = min(interval * 1.5, 0.25)  # fast for quick commands, cheap for slow


def _exec_result(status: dict[str, Any]) -> ExecResult:
    out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
    err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
    rc = status.get("exitcode")
    if rc is None:  # killed by a signal: report it the way a shell does
        rc = 128 + int(status.get("signal", 0))
    return ExecResult(int(rc), out, err)


# --------------------------------------------------------------------------
# QEMU process


class Monitor(GuestAgent):
    """QEMU's QMP monitor, on the agent's wire format (JSON lines, the request's id
    echoed in the answer): its greeting and events carry no id and are skipped, and the
    capabilities handshake QMP wants first is made on each new connection."""

    what = "QEMU's monitor"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._negotiated = False

    def close(self) -> None:
        super().close()
        self._negotiated = False

    def call(
        self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> Any:
        if not self._negotiated:
            super().call("qmp_capabilities", timeout=timeout)
            self._negotiated = True
        return super().call(command, arguments, timeout)

    def await_migration(self, deadline: float, proc: subprocess.Popen[bytes]) -> None:
        """Until the migration in progress (out or in) completes; LabError if it fails,
        QEMU exits or the deadline passes."""
        while True:
            got = self.call("query-migrate", timeout=max(1.0, deadline - time.monotonic()))
            status = got.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise LabError(f"migration {status}: {got.get('error-desc', 'no reason given')}")
            if proc.poll() is not None:
                raise LabError(f"QEMU exited with {proc.returncode} during a migration")
            if time.monotonic() > deadline:
                raise LabError(f"migration not done in time (status {status!r})")
            time.sleep(0.05)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: the kernel SIGKILLs QEMU when the Python process dies."""

    def preexec() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took hold
            os._exit(1)

    return preexec


def _kill_process(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    _LIVE_QEMUS.pop(proc.pid, None)


@atexit.register
def _kill_all_qemus() -> None:
    for proc in list(_LIVE_QEMUS.values()):
        _kill_process(proc, grace=1.0)


# vCPUs of a guest. One guest alone on the host (the scripts: demo, benchmarks, soak;
# the lab_alone tests) gets two, as it always had. A guest beside another (the lab's
# other tests, two xdist workers on the 2-core host) gets one: two guests of two vCPUs
# are four MTTCG threads on two cores, and a vCPU waiting for a descheduled sibling
# (TLB flushes, IPIs: work every vCPU of the guest must join) idles a core. Measured
# (tests/lab/README.md): test bodies ~30 % faster, host system time a quarter.
ALONE_CPUS = 2
BESIDE_CPUS = 1


def kernel_cmdline(iommu: bool) -> str:
    # mitigations=off: no guest-side speculation workarounds to emulate under TCG.
    parts = ["root=/dev/vda", "rw", "console=ttyS0", "mitigations=off"]
    if iommu:
        # An emulated VT-d lets vfio-pci bind VFs (it refuses without an IOMMU);
        # iommu=pt keeps ordinary DMA untranslated, so it costs little.
        parts += ["intel_iommu=on", "iommu=pt"]
    return " ".join(parts)


def qemu_command(
    image: LabImage,
    workdir: Path,
    *,
    iommu: bool,
    serial_log: Path | None,
    memory: str = "2G",
    smp: int = ALONE_CPUS,
    disk: Path | None = None,
    keep_writes: bool = False,
    incoming: bool = False,
    igb: bool = True,
) -> list[str]:
    """The guest's QEMU command line (accel=tcg always: KVM here hangs, see LAB.md).

    serial_log None means an interactive console on stdio: Ctrl-C goes to the
    guest, Ctrl-A X quits, Ctrl-A C switches to the QEMU monitor.

    The disk is the image's rootfs or ``disk``, behind a copy-on-write overlay QEMU
    drops at exit (snapshot=on) unless ``keep_writes``. ``incoming``: the guest waits
    for a migration stream (``migrate-incoming`` on the monitor) instead of booting;
    every device must then be as it was where the stream was saved. ``igb``: False for a
    node without the emulated SR-IOV NIC (its root port stays, empty).
    """
    drive = f"file={disk or image.rootfs},format=raw,if=virtio"
    if not keep_writes:
        drive += ",snapshot=on"
    cmd = [
        QEMU,
        "-nodefaults",
        "-machine",
        "q35,accel=tcg",
        "-cpu",
        "max",
        "-smp",
        str(smp),
        "-m",
        memory,
        "-display",
        "none",
        "-vga",
        "none",
    ]
    if serial_log is not None:
        cmd += ["-serial", f"file:{serial_log}", "-monitor", "none"]
    else:
        cmd += [
            "-chardev",
            "stdio,id=con0,mux=on,signal=off",
            "-serial",
            "chardev:con0",
            "-mon",
            "chardev=con0,mode=readline",
        ]
    if iommu:
        cmd += ["-device", "intel-iommu"]
    cmd += [
        "-kernel",
        str(image.boot_kernel),
        "-initrd",
        str(image.initrd),
        "-append",
        kernel_cmdline(iommu),
        "-drive",
        drive,
        "-netdev",
        "user,id=n0,restrict=on",
        "-device",
        "virtio-net-pci,netdev=n0",
        "-device",
        "virtio-serial-pci",
        "-chardev",
        f"socket,path={workdir / 'qga.sock'},server=on,wait=off,id=qga0",
        "-device",
        "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        "-qmp",
        f"unix:{workdir / 'qmp.sock'},server=on,wait=off",
        "-device",
        "pcie-root-port,id=rp1,chassis=1,slot=1",
    ]
    if igb:
        cmd += ["-netdev", "user,id=n1,restrict=on", "-device", "igb,bus=rp1,netdev=n1"]
    cmd += [
        "-virtfs",
        f"local,path={REPO_ROOT},mount_tag=src,security_model=none,readonly=on",
    ]
    if incoming:
        cmd += ["-incoming", "defer"]
    return cmd


def start_qemu(
    cmd: list[str], workdir: Path, *, interactive: bool = False
) -> subprocess.Popen[bytes]:
    """Start QEMU; it is registered for killing at exit and dies with us."""
    stdio: dict[str, Any] = {}
    if not interactive:
        err = (workdir / "qemu.stderr").open("wb")
        stdio = {"stdin": subprocess.DEVNULL, "stdout": err, "stderr": err}
    # preexec_fn is the only way to set PR_SET_PDEATHSIG; the harness starts
    # QEMU from the main thread only.
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent(os.getpid()), **stdio)  # noqa: PLW1509
    _LIVE_QEMUS[proc.pid] = proc
    return proc


# --------------------------------------------------------------------------
# The guest


@dataclass(frozen=True)
class BootInfo:
    number: int
    boot_id: str
    seconds: float


@dataclass(frozen=True)
class SavedBoot:
    """A lab guest as its boot left it, to start other guests from instead of booting.

    ``disk``: a copy of the image's rootfs with the boot's writes; ``state``: QEMU's
    migration stream of the guest's memory and devices, saved (paused) right after the
    boot-done marker, before anything else ran. A guest started from it gets its own
    copy-on-write overlay of that disk (snapshot=on, as a booted guest has of the
    image), the host's time (the saved clock is the save's), and runs within seconds
    where a boot takes 40-55 s under TCG. It shares the saved boot's boot_id; its own
    reboots are real boots (a new boot_id, a boot-done marker in its serial log).
    """

    disk: Path
    state: Path
    boot: BootInfo
    iommu: bool
    cpus: int


@dataclass(frozen=True)
class InstallReport:
    compiled: bool
    output: str
    unit_installed: bool
    seconds: float


class Guest:
    """One booted lab guest (one QEMU process, snapshot=on): booted, or started from a
    saved boot (``saved``); ``keep_disk``: a disk of its own that keeps its writes
    (the guest a SavedBoot is made from)."""

    def __init__(
        self,
        image: LabImage,
        *,
        iommu: bool = True,
        name: str = "guest",
        saved: SavedBoot | None = None,
        keep_disk: Path | None = None,
        cpus: int = ALONE_CPUS,
        igb: bool = True,
    ) -> None:
        if saved is not None and not igb:
            raise LabError("a saved boot has the igb NIC: a guest without it is booted")
        self.image = image
        self.iommu = iommu
        self.igb = igb
        self.cpus = saved.cpus if saved is not None else cpus
        self.name = name
        self.saved = saved
        self.keep_disk = keep_disk
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{name}-"))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        self.serial_log = self.workdir / "serial.log"
        self.agent = GuestAgent(self.workdir / "qga.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        self.boot_info: BootInfo | None = None
        self.reboots = 0  # real reboots since it started (a test's lab_needs("reboot"))
        self._holders = 0

    # ---- lifecycle -------------------------------------------------------

    def boot(self, timeout: float = 300.0) -> BootInfo:
        if self.saved is not None:
            return self._start_saved(self.saved, timeout)
        cmd = qemu_command(
            self.image,
            self.workdir,
            iommu=self.iommu,
            serial_log=self.serial_log,
            smp=self.cpus,
            disk=self.keep_disk,
            keep_writes=self.keep_disk is not None,
            igb=self.igb,
        )
        log(f"{self.name}: starting QEMU (TCG, iommu={self.iommu}, {self.cpus} vCPU)")
        self.proc = start_qemu(cmd, self.workdir)
        return self.wait_boot(timeout, started=time.monotonic())

    def _start_saved(self, saved: SavedBoot, timeout: float) -> BootInfo:
        """Start where the saved boot stopped: load its stream, run, set the clock."""
        started = time.monotonic()
        deadline = started + timeout
        cmd = qemu_command(
            self.image,
            self.workdir,
            iommu=saved.iommu,
            serial_log=self.serial_log,
            smp=saved.cpus,
            disk=self.keep_disk or saved.disk,
            keep_writes=self.keep_disk is not None,
            incoming=True,
        )
        log(
            f"{self.name}: starting QEMU from the saved boot "
            f"(TCG, iommu={saved.iommu}, {saved.cpus} vCPU)"
        )
        self.proc = start_qemu(cmd, self.workdir)
        monitor = Monitor(self.workdir / "qmp.sock")
        try:
            monitor.call("migrate-incoming", {"uri": f"file:{saved.state}"}, timeout=60.0)
            monitor.await_migration(min(deadline, time.monotonic() + MIGRATION_TIMEOUT), self.proc)
            monitor.call("cont")  # saved paused, so it arrives paused
        finally:
            monitor.close()
        self.agent.close()
        self.agent.sync(timeout=max(10.0, deadline - time.monotonic()))
        # Its clock says when the boot was saved; a booted guest reads the RTC.
        self.agent.call("guest-set-time", {"time": time.time_ns()})
        info = BootInfo(saved.boot.number, saved.boot.boot_id, time.monotonic() - started)
        self.boot_info = info
        log(f"{self.name}: started from the saved boot in {info.seconds:.1f} s")
        return info

    def save(self, state: Path) -> None:
        """Pause and save this guest's memory and devices to ``state``, then stop QEMU
        (its disk, flushed when the migration completes, goes with the stream)."""
        if self.proc is None or self.boot_info is None:
            raise LabError("saving a guest that never booted")
        self.agent.close()
        monitor = Monitor(self.workdir / "qmp.sock")
        try:
            monitor.call("stop")
            monitor.call("migrate", {"uri": f"file:{state}"})
            monitor.await_migration(time.monotonic() + MIGRATION_TIMEOUT, self.proc)
            with suppress(LabError):  # QEMU may close the socket before it answers
                monitor.call("quit")
        finally:
            monitor.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{self.name}: QEMU still up 30 s after quit, killing it")
        self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_boot(
        self, timeout: float, *, started: float, previous_boot_id: str | None = None
    ) -> BootInfo:
        """Wait for a boot-done marker from a boot other than previous_boot_id."""
        met = sys.exception()  # a failure the caller is handling (see GuestFrozen)
        deadline = started + timeout
        next_note = started + 15
        while True:
            found = self._last_marker()
            if found is not None and found[1] != previous_boot_id:
                break
            self._check_running()
            now = time.monotonic()
            if now > deadline:
                lockup = self.kernel_lockup()
                if lockup is not None:
                    raise GuestKernelHang(
                        f"{self.name}: no boot-done marker after {timeout:.0f} s and the "
                        f"guest kernel reports a soft lockup ({lockup!r}): a kernel or "
                        "driver hang, not an emulator freeze; serial tail:\n"
                        + self.serial_text(tail=3000)
                    )
                stall = self.kernel_stall()
                if stall is not None:  # a boot the emulator starved: as frozen as a command
                    raise GuestFrozen(
                        f"{self.name}: no boot-done marker after {timeout:.0f} s and the "
                        f"guest kernel reports a stall ({stall!r}): its vCPUs were starved",
                        met=met,
                    )
                raise GuestBootStuck(
                    f"{self.name}: no boot-done marker after {timeout:.0f} s; serial tail:\n"
                    + self.serial_text(tail=3000)
                    + "\n"
                    + self._boot_jobs()
                )
            if now > next_note:
                log(
                    f"{self.name}: still booting ({now - started:.0f} s): "
                    f"{self._last_serial_line()!r}"
                )
                next_note = now + 15
            time.sleep(0.2)
        self.agent.close()
        self.agent.sync(timeout=max(10.0, deadline - time.monotonic()))
        info = BootInfo(found[0], found[1], time.monotonic() - started)
        self.boot_info = info
        log(f"{self.name}: boot {info.number} done in {info.seconds:.1f} s")
        return info

    def _boot_jobs(self) -> str:
        """What systemd still waits for, asked through the agent (it starts before
        multi-user.target, so it usually answers when the marker's unit never ran)."""
        script = (
            "systemctl list-jobs --no-pager; systemctl --failed --no-pager; "
            "journalctl -b --no-pager -o short-monotonic | tail -n 60"
        )
        try:
            self.agent.close()
            self.agent.sync(timeout=10.0)
            res = self.agent.exec(["/bin/sh", "-c", script], timeout=30.0)
        except LabError as exc:
            return f"(systemd's pending jobs: the guest agent did not answer: {exc})"
        return f"systemd's pending jobs, failed units and journal tail:\n{res.out}{res.err}"

    def reboot(self, timeout: float = 300.0) -> BootInfo:
        if self.boot_info is None:
            raise LabError("reboot of a guest that never booted")
        previous = self.boot_info.boot_id
        started = time.monotonic()
        log(f"{self.name}: rebooting")
        # Fire and forget: the agent dies with the old system.
        self.agent.call(
            "guest-exec", {"path": "/bin/systemctl", "arg": ["reboot"], "env": GUEST_ENV}
        )
        info = self.wait_boot(timeout, started=started, previous_boot_id=previous)
        self.reboots += 1
        return info

    def poweroff(self, timeout: float = 60.0) -> float:
        """systemctl poweroff (QMP system_powerdown does nothing in minbase)."""
        started = time.monotonic()
        with suppress(LabError):
            self.agent.call(
                "guest-exec", {"path": "/bin/systemctl", "arg": ["poweroff"], "env": GUEST_ENV}
            )
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: no poweroff after {timeout:.0f} s, killing QEMU")
        self.kill()
        return time.monotonic() - started

    def kill(self) -> None:
        self.agent.close()
        if self.proc is not None:
            _kill_process(self.proc)

    def close(self) -> None:
        """Kill QEMU and remove the temp dir (sockets, logs)."""
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            err = (self.workdir / "qemu.stderr").read_text(errors="replace")[-3000:]
            raise LabError(
                f"{self.name}: QEMU exited with {self.proc.returncode}:\n{err}\n"
                f"serial tail:\n{self.serial_text(tail=3000)}"
            )

    # ---- logs ------------------------------------------------------------

    def _serial_bytes(self) -> bytes:
        try:
            return self.serial_log.read_bytes()
        except FileNotFoundError:
            return b""

    def _last_marker(self) -> tuple[int, str] | None:
        matches = BOOT_MARKER.findall(self._serial_bytes())
        if not matches:
            return None
        number, boot_id = matches[-1]
        return int(number), boot_id.decode()

    def _last_serial_line(self) -> str:
        lines = [ln for ln in self.serial_text(tail=2000).splitlines() if ln.strip()]
        return lines[-1][-120:] if lines else ""

    def serial_text(self, tail: int = 20000) -> str:
        text = self._serial_bytes()[-tail:].decode(errors="replace")
        return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)  # drop colour codes

    def journal(self, lines: int = 300) -> str:
        res = self.run(f"journalctl -b --no-pager -o short-monotonic | tail -n {lines}", timeout=60)
        return res.out + res.err

    # ---- commands --------------------------------------------------------

    def run(
        self, script: str | list[str], timeout: float = 60.0, stdin: bytes | None = None
    ) -> ExecResult:
        """Run a shell script (str) or an argv (list) in the guest: (exit code, stdout, stderr)."""
        argv = ["/bin/sh", "-c", script] if isinstance(script, str) else list(script)
        # A failure the caller is handling: an assertion that failed, then a status asked
        # for the report. Read now: below, the agent's own errors are being handled.
        met = sys.exception()
        try:
            return self.agent.exec(argv, timeout=timeout, stdin=stdin)
        except GuestAgentSilent as exc:
            lockup = self.kernel_lockup()
            if lockup is not None:
                raise GuestKernelHang(
                    f"{self.name}: the guest agent went silent and the guest kernel reports "
                    f"a soft lockup ({lockup!r}): a kernel or driver hang, not an emulator "
                    f"freeze; serial tail:\n{self.serial_text(tail=1500)}"
                ) from exc
            stall = self.kernel_stall()
            if stall is None:
                # What the console said last is the only clue left to what stopped it.
                raise GuestAgentSilent(
                    f"{self.name}: {exc}; serial tail:\n{self.serial_text(tail=1500)}"
                ) from exc
            raise GuestFrozen(
                f"{self.name}: the guest agent went silent and the guest kernel reports "
                f"a stall ({stall!r}): its vCPUs were starved",
                met=met,
            ) from exc
        except LabError:
            self._check_running()  # QEMU exited: that is the error, with its stderr
            raise

    def kernel_stall(self) -> str | None:
        """The guest kernel's first RCU stall report since its last boot, if any."""
        return self._this_boot_line(KERNEL_STALL)

    def kernel_lockup(self) -> str | None:
        """The guest kernel's first soft lockup report since its last boot, if any."""
        return self._this_boot_line(KERNEL_LOCKUP)

    def _this_boot_line(self, pattern: re.Pattern[bytes]) -> str | None:
        log_bytes = self._serial_bytes()
        this_boot = log_bytes[max(log_bytes.rfind(KERNEL_BANNER), 0) :]
        m = pattern.search(this_boot)
        if m is None:
            return None
        end = this_boot.find(b"\n", m.start())
        return this_boot[m.start() : end if end >= 0 else None].decode(errors="replace").strip()

    def check(self, script: str, timeout: float = 60.0, stdin: bytes | None = None) -> str:
        """Run and return stdout; raise with the full result if it fails."""
        res = self.run(script, timeout=timeout, stdin=stdin)
        if not res.ok:
            raise LabError(f"guest command failed: {script}\n{res.describe()}")
        return res.out

    def json(self, script: str, timeout: float = 60.0) -> Any:
        return json.loads(self.check(script, timeout=timeout) or "null")

    def read(self, path: str) -> str:
        return self.check(f"cat {shlex.quote(path)}").strip()

    def write(self, path: str, value: str | int, timeout: float = 60.0) -> ExecResult:
        """Write value to a (sysfs) file; the result carries the kernel's errno text.

        /bin/echo, not the shell's: dash reports every failed builtin write as
        "I/O error", hiding EBUSY/ERANGE.
        """
        return self.run(
            f"/bin/echo {shlex.quote(str(value))} > {shlex.quote(path)}", timeout=timeout
        )

    def exists(self, path: str) -> bool:
        return self.run(f"test -e {shlex.quote(path)}").ok

    def wait_for(self, condition: str, timeout: float = 30.0, interval: float = 0.1) -> float:
        """Poll a shell condition inside the guest (one exec, bounded by timeout(1)):
        every ``interval`` for the first FAST_POLL seconds, then every SLOW_POLL (see
        there: a poll forks in the guest, and a long wait at 0.1 s starves it)."""
        started = time.monotonic()
        fast = max(1, int(FAST_POLL / interval))
        slow = max(interval, SLOW_POLL)
        loop = (
            f"n=0; until {condition}; do if [ $n -lt {fast} ]; then n=$((n+1)); "
            f"sleep {interval}; else sleep {slow}; fi; done"
        )
        script = f"timeout {timeout:.1f} sh -c {shlex.quote(loop)}"
        res = self.run(script, timeout=timeout + 30)
        if not res.ok:
            raise GuestTimeout(
                f"condition not met within {timeout:.0f} s: {condition}\n" + res.describe()
            )
        return time.monotonic() - started

    def wait_until(
        self,
        predicate: Callable[[], bool],
        *,
        timeout: float = 30.0,
        interval: float = 0.2,
        what: str = "condition",
    ) -> float:
        """Poll a host-side predicate over guest state, bounded by timeout: every
        ``interval`` for the first FAST_POLL seconds, then at most every SLOW_POLL (a
        predicate runs guest commands: journalctl, a state file parsed)."""
        started = time.monotonic()
        while not predicate():
            waited = time.monotonic() - started
            if waited > timeout:
                raise GuestTimeout(f"{what} not met within {timeout:.0f} s")
            time.sleep(interval if waited < FAST_POLL else max(interval, SLOW_POLL))
        return time.monotonic() - started

    # ---- systemd, modules ---------------------------------------------------

    def start_unit(self, name: str, script: str, max_seconds: int = 600) -> str:
        """Run a long-lived command as a transient unit (never unbounded)."""
        unit = f"{name}.service"
        self.check(
            f"systemd-run --quiet --collect --unit={shlex.quote(unit)} "
            f"-p RuntimeMaxSec={max_seconds} /bin/sh -c {shlex.quote(script)}"
        )
        return unit

    def stop_unit(self, unit: str) -> None:
        self.run(f"systemctl stop {shlex.quote(unit)}", timeout=60)

    def unit_pid(self, unit: str) -> int:
        return int(self.check(f"systemctl show -p MainPID --value {shlex.quote(unit)}").strip())

    def modprobe(self, module: str, *, remove: bool = False, timeout: float = 120.0) -> ExecResult:
        flag = "-r " if remove else ""
        return self.run(f"modprobe {flag}{shlex.quote(module)}", timeout=timeout)

    def module_loaded(self, module: str) -> bool:
        name = module.replace("-", "_")
        return self.run(f"grep -q '^{name} ' /proc/modules").ok

    # ---- links ---------------------------------------------------------------

    def ip_links(self) -> list[dict[str, Any]]:
        return list(self.json("ip -d -j link show"))

    def ip_link(self, dev: str) -> dict[str, Any]:
        return dict(self.json(f"ip -d -j link show dev {shlex.quote(dev)}")[0])

    def vf_info(self, pf_netdev: str) -> list[dict[str, Any]]:
        return list(self.ip_link(pf_netdev).get("vfinfo_list", []))

    def rdma_links(self) -> list[dict[str, Any]]:
        return list(self.json("rdma -j link show"))

    # ---- SR-IOV: igb --------------------------------------------------------

    def igb_pf(self) -> str:
        """PCI address of the emulated igb (82576) PF."""
        out = self.check("cd /sys/bus/pci/drivers/igb && ls -d 0000:* | head -n1").strip()
        if not out:
            raise LabError("no device bound to igb in the guest")
        return out

    def pci_path(self, bdf: str, attr: str = "") -> str:
        return f"/sys/bus/pci/devices/{bdf}/{attr}".rstrip("/")

    def set_numvfs(self, pf_bdf: str, count: int, timeout: float = 120.0) -> ExecResult:
        return self.write(self.pci_path(pf_bdf, "sriov_numvfs"), count, timeout=timeout)

    def numvfs(self, pf_bdf: str) -> int:
        return int(self.read(self.pci_path(pf_bdf, "sriov_numvfs")))

    def vf_bdfs(self, pf_bdf: str) -> list[str]:
        """VF PCI addresses in VF index order (virtfnN links of the PF)."""
        out = self.check(
            f'cd {self.pci_path(pf_bdf)} && for l in virtfn*; do [ -e "$l" ] && '
            'echo "${l#virtfn} $(basename $(readlink $l))"; done; true'
        )
        pairs = sorted((int(i), bdf) for i, bdf in (ln.split() for ln in out.splitlines()))
        return [bdf for _, bdf in pairs]

    def pci_netdevs(self, bdf: str) -> list[str]:
        out = self.run(f"ls {self.pci_path(bdf, 'net')} 2>/dev/null")
        return out.out.split()

    def wait_vf_netdevs(self, pf_bdf: str, count: int, timeout: float = 60.0) -> dict[str, str]:
        """Wait until each of count VFs has a netdev and udev renamed it: VF PCI -> name."""
        pf = self.pci_path(pf_bdf)
        cond = (
            f"[ $(ls -d {pf}/virtfn*/net/* 2>/dev/null | wc -l) -ge {count} ] && "
            "udevadm settle --timeout=5"
        )
        self.wait_for(cond, timeout=timeout)
        return {bdf: self.pci_netdevs(bdf)[0] for bdf in self.vf_bdfs(pf_bdf)}

    # ---- SR-IOV: netdevsim -------------------------------------------------

    def nsim_create(
        self, dev_id: int, numvfs: int = 0, *, max_vfs: int | None = None, ports: int = 1
    ) -> str:
        """Create netdevsim device dev_id; returns its (first) netdev name."""
        sysdev = f"/sys/bus/netdevsim/devices/netdevsim{dev_id}"
        self.check("modprobe netdevsim")
        self.check(f"echo '{dev_id} {ports}' > /sys/bus/netdevsim/new_device")
        self.wait_for(
            f"ls {sysdev}/net/* >/dev/null 2>&1 && udevadm settle --timeout=5", timeout=30
        )
        if max_vfs is not None:
            # The default limit is 4 VFs; debugfs is the only knob.
            self.check(
                "mountpoint -q /sys/kernel/debug || mount -t debugfs none "
                f"/sys/kernel/debug; echo {max_vfs} > "
                f"/sys/kernel/debug/netdevsim/netdevsim{dev_id}/max_vfs"
            )
        if numvfs:
            self.check(f"echo {numvfs} > {sysdev}/sriov_numvfs")
        return self.check(f"ls {sysdev}/net | head -n1").strip()

    def nsim_delete(self, dev_id: int) -> ExecResult:
        return self.run(f"echo {dev_id} > /sys/bus/netdevsim/del_device")

    # ---- vfio ------------------------------------------------------------

    def bind_vfio(self, bdf: str) -> int:
        """Bind a VF to vfio-pci via driver_override; returns its IOMMU group."""
        dev = self.pci_path(bdf)
        self.check("modprobe vfio-pci")
        self.check(
            f"echo vfio-pci > {dev}/driver_override && "
            f"if [ -e {dev}/driver ]; then echo {bdf} > {dev}/driver/unbind; fi && "
            f"echo {bdf} > /sys/bus/pci/drivers_probe"
        )
        self.wait_for(f'[ "$(basename $(readlink {dev}/driver))" = vfio-pci ]', timeout=30)
        return int(self.check(f"basename $(readlink {dev}/iommu_group)").strip())

    def unbind_vfio(self, bdf: str) -> None:
        dev = self.pci_path(bdf)
        self.run(
            f"[ -e {dev}/driver ] && echo {bdf} > {dev}/driver/unbind; "
            f"[ -e {dev}/driver_override ] && echo > {dev}/driver_override; true"
        )

    def hold_open(self, path: str, max_seconds: int = 900) -> tuple[str, int]:
        """A process that keeps path open (e.g. /dev/vfio/GROUP): (unit, pid)."""
        self._holders += 1
        unit = self.start_unit(
            f"lab-hold-{self._holders}",
            f"exec 3<>{shlex.quote(path)}; exec sleep {max_seconds}",
            max_seconds=max_seconds + 5,
        )
        self.wait_for(
            f"ls -l /proc/$(systemctl show -p MainPID --value {unit})/fd "
            f"2>/dev/null | grep -q {shlex.quote(path)}",
            timeout=30,
        )
        return unit, self.unit_pid(unit)

    def uverbs_node(self, ib_device: str) -> str:
        """/dev/infiniband/uverbsN of an RDMA device (what a verbs user holds open)."""
        out = self.check(
            "for d in /sys/class/infiniband_verbs/uverbs*; do "
            f'[ "$(cat $d/ibdev)" = {shlex.quote(ib_device)} ] && basename $d; done; true'
        ).strip()
        assert out, f"no uverbs node for {ib_device}"
        return f"/dev/infiniband/{out.splitlines()[0]}"

    def pids_holding(self, path: str) -> list[int]:
        # One find over every fd, not a readlink process per fd (~2 s a call under TCG).
        pattern = re.sub(r"([][*?\\])", r"\\\1", path)  # -lname takes a glob: match it literally
        out = self.run(
            f"find /proc/[0-9]*/fd -lname {shlex.quote(pattern)} 2>/dev/null; true", timeout=60
        ).out
        return sorted({int(line.split("/")[2]) for line in out.split()})

    # ---- rdmad ---------------------------------------------------------------

    def mount_src(self) -> None:
        self.check(
            f"mountpoint -q {SRC_MOUNT} || {{ mkdir -p {SRC_MOUNT} && "
            f"mount -t 9p -o trans=virtio,version=9p2000.L,ro src {SRC_MOUNT}; }}"
        )

    def install_rdmad(self) -> InstallReport:
        """Install rdmad the way RDMAD_LAB_INSTALL says (default: the package).

        package: the .deb built from this tree (once per session, cached by its
        inputs) installed with `apt-get install ./rdmad_*.deb` (the guest has no
        network: its dependencies come from the image), then the service is
        stopped and disabled and its state removed, so every test starts rdmad
        itself, with its own config, on a node it has never seen, as with the
        source install. Already installed (this version): a
        no-op, the service untouched. source: see install_source().
        A failed install or compile is reported, never raised: rdmad may be
        half-written.
        """
        if install_mode() == "source":
            return self.install_source()
        started = time.monotonic()
        deb = build_deb()
        version = deb.name.split("_")[1]
        status = self.run("dpkg-query -W -f '${Status} ${Version}' rdmad").out.strip()
        if status == f"install ok installed {version}":
            # Installed by an earlier test: leave the service as the caller has it
            # (a test may call this while its rdmad is running).
            return InstallReport(True, status, True, time.monotonic() - started)
        res = self.install_deb(deb)
        ok = res.ok and self.run("command -v rdmad && command -v rdmad-ctl").ok
        if ok:
            # Installed, never run: the postinst's first start wrote a state file,
            # which tests of a node rdmad has never seen must not find.
            self.check(
                "systemctl disable --now rdmad.service && rm -rf /var/lib/rdmad /run/rdmad",
                timeout=360,
            )
        else:
            log(
                f"{self.name}: installing {deb.name} failed (reported, not raised):\n"
                + res.describe()
            )
        return InstallReport(ok, res.out + res.err, ok, time.monotonic() - started)

    def install_deb(self, deb: Path, timeout: float = 600.0) -> ExecResult:
        """`apt-get install ./DEB` of a .deb under the repo (seen through the 9p share)."""
        self.mount_src()
        rel = deb.resolve().relative_to(REPO_ROOT)
        guest_deb = f"{GUEST_DEB_DIR}/{deb.name}"
        self.check(
            f"mkdir -p {GUEST_DEB_DIR} && cp {SRC_MOUNT}/{shlex.quote(str(rel))} {guest_deb} "
            f"&& chmod 0644 {guest_deb}",
            timeout=120,
        )
        return self.run(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"-o Dpkg::Options::=--force-confold {guest_deb}",
            timeout=timeout,
        )

    def install_source(self) -> InstallReport:
        """Copy rdmad/ from the 9p share into the guest venv and compile it.

        Cheap (seconds) and independent of the image: the image holds only the
        dependencies. A package that does not compile or import is reported,
        never raised: rdmad may be half-written.
        """
        started = time.monotonic()
        self.mount_src()
        self.check(
            f"set -e; rm -rf {INSTALL_DIR}.new; mkdir -p {INSTALL_DIR}.new; "
            f"tar -C {SRC_MOUNT} --exclude=__pycache__ -cf - rdmad "
            f"| tar -C {INSTALL_DIR}.new -xf -; "
            f"rm -rf {INSTALL_DIR}; mv {INSTALL_DIR}.new {INSTALL_DIR}; "
            f"echo {INSTALL_DIR} > $(echo {VENV}/lib/python3*/site-packages)/rdmad-src.pth",
            timeout=120,
        )
        compiled = self.run(f"{VENV}/bin/python -m compileall -q {INSTALL_DIR}", timeout=300)
        if not compiled.ok:
            log(
                f"{self.name}: compileall of rdmad failed (reported, not raised):\n"
                + compiled.describe()
            )
        for tool, module in (("rdmad", "rdmad.cli"), ("rdmad-ctl", "rdmad.ctl")):
            wrapper = f'#!/bin/sh\nexec {VENV}/bin/python -m {module} "$@"\n'
            self.check(
                f"cat > /usr/local/bin/{tool} && chmod 0755 /usr/local/bin/{tool}",
                stdin=wrapper.encode(),
            )
        unit = REPO_ROOT / "systemd" / "rdmad.service"
        if unit.is_file():
            text = rewrite_exec_start(unit.read_text())
            self.check(
                "cat > /etc/systemd/system/rdmad.service && systemctl daemon-reload",
                stdin=text.encode(),
            )
        return InstallReport(
            compiled.ok, compiled.out + compiled.err, unit.is_file(), time.monotonic() - started
        )


def _install_then_unmount(guest: Guest) -> None:
    """install_rdmad(), failing loudly, then the 9p share unmounted (a guest with a 9p
    export mounted cannot be saved)."""
    report = guest.install_rdmad()
    if not report.compiled:
        raise LabError(f"installing rdmad failed:\n{report.output[-3000:]}")
    guest.check(f"! mountpoint -q {SRC_MOUNT} || umount {SRC_MOUNT}; sync", timeout=120)


def install_rdmad(guest: Guest) -> str:
    """Function form of Guest.install_rdmad(); returns the python that imports rdmad."""
    guest.install_rdmad()
    return rdmad_python()


def rdmad_python() -> str:
    """The guest python whose sys.path has the installed rdmad and its dependencies."""
    return PACKAGE_PYTHON if install_mode() == "package" else f"{VENV}/bin/python"


def rewrite_exec_start(unit_text: str) -> str:
    """Point ExecStart= of the repo's unit at /usr/local/bin/rdmad, keeping its arguments."""
    return "\n".join(_rewrite_line(line) for line in unit_text.splitlines()) + "\n"


def _rewrite_line(line: str) -> str:
    m = re.match(r"^(ExecStart=[-@:+!]*)(\S+)(.*)$", line)
    if not m:
        return line
    prefix, program, rest = m.groups()
    module = re.match(r"^\s+-m\s+rdmad(?:\.\w+)*(.*)$", rest)
    if "python" in Path(program).name and module:
        return f"{prefix}/usr/local/bin/rdmad{module.group(1)}"
    if Path(program).name == "rdmad":
        return f"{prefix}/usr/local/bin/rdmad{rest}"
    return line


# --------------------------------------------------------------------------
# One guest at a time


def remove_stale_workdirs() -> None:
    """Temp dirs of harness processes that were SIGKILLed (their QEMU died with them)."""
    for workdir in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(workdir, ignore_errors=True)


# A lab script's exit code for "the guest stopped answering" (bench/run.py runs it again).
EXIT_GUEST_STOPPED = 3


def lab_script_exit(main: Callable[[], int]) -> int:
    """main()'s exit code, or EXIT_GUEST_STOPPED when its guest stopped answering, froze
    under the emulator (in a command or in a boot: the kernel's RCU stall reports) or
    never finished a boot.

    For benchmarks: a guest the emulator froze says nothing about rdmad, and a
    benchmark never fails on what it measured, so bench/run.py runs one that exits
    this way once more; the first run's reason (for a stuck boot, systemd's pending
    jobs) is printed. A guest kernel's soft lockup (GuestKernelHang) is a finding and
    propagates. (Lab tests are stricter: conftest reruns only a first-failure
    GuestFrozen.)
    """
    try:
        return main()
    except GuestFrozen as exc:
        print(f"the guest froze under the emulator: {exc}", file=sys.stderr, flush=True)
        return EXIT_GUEST_STOPPED
    except GuestAgentSilent as exc:
        print(f"the guest stopped answering: {exc}", file=sys.stderr, flush=True)
        return EXIT_GUEST_STOPPED
    except GuestBootStuck as exc:
        print(f"the guest never finished a boot: {exc}", file=sys.stderr, flush=True)
        return EXIT_GUEST_STOPPED


def pool_or_exit(who: str) -> GuestPool:
    """A GuestPool for a script (demo, benchmarks, soak); if the lab can't run, prints
    the reason and exits 2 (bench/run.py tells that apart from an error). Its guests
    start from the saved states the tests keep (made here where there are none)."""
    missing = missing_prerequisite()
    image = find_image() if missing is None else None
    if image is None:
        print(f"{who}: the lab cannot run: {missing or 'no guest image'}", file=sys.stderr)
        raise SystemExit(2)
    return GuestPool(image)


class GuestPool:
    """At most one live guest: a test's own (``fresh()``: the tests' fixtures give every
    guest test one) or a shared one (``shared()``: the scripts' one guest, demo, soak and
    benchmarks). Several guests at once are several pools, one per pytest-xdist worker
    (workers.py).

    Unless ``saved_boot`` is False (or RDMAD_LAB_SAVED_BOOT=0), guests start from saved
    states (SavedBoot) instead of booting: the clean state (a boot, saved) and the
    installed state (made from the clean one: rdmad's .deb installed). Both are kept
    between runs and shared by every pool, keyed by what makes them (states.py): a run
    whose inputs did not change boots nothing until a test reboots, and one that
    changed the .deb makes only the installed state again. If making one fails
    (logged), guests boot (or install) instead.
    """

    def __init__(
        self,
        image: LabImage,
        *,
        iommu: bool = True,
        saved_boot: bool | None = None,
        cpus: int = ALONE_CPUS,
    ) -> None:
        remove_stale_workdirs()
        self.image = image
        self.iommu = iommu
        self.cpus = cpus  # of every guest of this pool (its states' command line has them)
        self._shared: Guest | None = None
        self._fresh: Guest | None = None
        self.last: Guest | None = None  # for failure reports, even of a failed boot
        if saved_boot is None:
            saved_boot = os.environ.get(SAVED_BOOT_ENV, "1") != "0"
        self.use_saved = saved_boot
        self._saved: SavedBoot | None = None
        self._installed: SavedBoot | None = None
        self._install_saved = saved_boot
        self._states = StateCache(image.directory.parent / "states", log)

    def saved_boot(self) -> SavedBoot | None:
        """The clean state (as booted), made on first use where no earlier run left it;
        None when guests boot instead."""
        if self._saved is not None or not self.use_saved:
            return self._saved
        self._saved = self._save("clean", self._clean_inputs(), None, lambda g: None)
        if self._saved is None:
            log("no saved boot: every guest boots instead")
            self.use_saved = False
        return self._saved

    def installed_boot(self) -> SavedBoot | None:
        """The clean state with rdmad's .deb installed as install_rdmad() leaves it
        (installed, never run, the service disabled; the 9p share unmounted, which QEMU
        needs to save), made on first use for this .deb: a guest started from it skips
        the ~20 s install. None where guests boot, rdmad is installed from source, or
        the install failed (each guest then installs itself, and a test sees the
        failure)."""
        if self._installed is not None or not self._install_saved:
            return self._installed
        base = self.saved_boot()
        if base is not None and install_mode() == "package":
            inputs = {
                "base": state_key(self._clean_inputs()),
                "deb": file_digest(build_deb()),
            }
            self._installed = self._save("installed", inputs, base, _install_then_unmount)
        if self._installed is None:
            self._install_saved = False
        return self._installed

    def _clean_inputs(self) -> dict[str, str]:
        """What makes the clean state: the image, QEMU, its command line (this
        checkout's path left out: the share is never mounted in a saved state) and
        this harness, which boots and saves it."""
        work = Path("/WORK")
        cmd = qemu_command(
            self.image, work, iommu=self.iommu, serial_log=work / "serial.log",
            smp=self.cpus, disk=Path("/DISK"), keep_writes=True,
        )  # fmt: skip
        rootfs = self.image.rootfs.stat()
        return {
            "image": f"{self.image.directory} {rootfs.st_size} {rootfs.st_mtime_ns}",
            "qemu": qemu_version(),
            "command": shlex.join(cmd).replace(str(REPO_ROOT), "/SRC"),
            "harness": file_digest(Path(__file__)),
            "iommu": str(self.iommu),
        }

    def _save(
        self,
        name: str,
        inputs: dict[str, str],
        base: SavedBoot | None,
        prepare: Callable[[Guest], None],
    ) -> SavedBoot | None:
        """The state ``name`` for ``inputs``: kept from an earlier run, or made now by
        a guest booted (or started from ``base``) on a copy of the clean disk that keeps
        its writes, ``prepare``d, then saved. None (logged) if making it failed."""

        def make(directory: Path) -> dict[str, Any]:
            disk = directory / "rootfs.img"
            guest = Guest(
                self.image, iommu=self.iommu, name=name, saved=base, keep_disk=disk,
                cpus=self.cpus,
            )  # fmt: skip
            try:
                subprocess.run(
                    [
                        "cp",
                        "--sparse=always",
                        str(base.disk if base else self.image.rootfs),
                        str(disk),
                    ],
                    check=True,
                    timeout=600,
                    capture_output=True,
                )
                boot = guest.boot()
                prepare(guest)
                guest.save(directory / "state")
            finally:
                guest.close()
            return {"number": boot.number, "boot_id": boot.boot_id, "seconds": boot.seconds}

        try:
            directory, made = self._states.obtain(name, inputs, make)
        except (LabError, OSError, subprocess.SubprocessError) as exc:
            log(f"saving the {name} guest failed: {exc}")
            return None
        boot = BootInfo(int(made["number"]), str(made["boot_id"]), float(made["seconds"]))
        return SavedBoot(directory / "rootfs.img", directory / "state", boot, self.iommu, self.cpus)

    def shared(self, *, installed: bool = True) -> Guest:
        """The pool's one long-lived guest (started on first use, again if it died):
        ``installed`` (from the installed state), or as booted (the demo installs it
        where the user sees it)."""
        self.release_fresh()
        if self._shared is not None and not self._shared.alive():
            self._shared.close()
            self._shared = None
        if self._shared is None:
            self._shared = self._boot("shared", installed=installed)
        return self._shared

    def _boot(self, name: str, *, installed: bool, cold: bool = False, igb: bool = True) -> Guest:
        if self.last is not None and self.last not in (self._shared, self._fresh):
            self.last.close()  # a failed boot kept only for its report
        saved = None
        if not cold:
            saved = (self.installed_boot() if installed else None) or self.saved_boot()
        guest = Guest(self.image, iommu=self.iommu, name=name, saved=saved, cpus=self.cpus, igb=igb)
        self.last = guest
        try:
            guest.boot()
        except BaseException:
            guest.kill()  # keep its workdir: the serial log goes into the report
            raise
        return guest

    def discard_shared(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def fresh(self, *, installed: bool = False, cold: bool = False, igb: bool = True) -> Guest:
        """A guest of its own: as booted, or ``installed`` (rdmad's .deb in place, as
        install_rdmad() leaves it; from the installed_boot() where there is one).
        ``cold``: really booted, never from a saved state (the test installs rdmad
        itself where it wants it). ``igb`` False: a node without the emulated SR-IOV NIC
        (booted: the saved states have it)."""
        self.discard_shared()
        self.release_fresh()
        self._fresh = self._boot("fresh", installed=installed, cold=cold or not igb, igb=igb)
        return self._fresh

    def release_fresh(self) -> None:
        if self._fresh is not None:
            self._fresh.close()
            self._fresh = None

    def close(self) -> None:
        self.release_fresh()
        self.discard_shared()
        if self.last is not None:
            self.last.close()
        self._states.release()
