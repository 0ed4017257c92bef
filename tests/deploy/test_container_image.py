"""The container image of deploy/kubernetes, built and run here (podman, as root).

`scripts/build-image.sh` makes it from the project's .deb on a debootstrapped Debian
base: no registry is reached. Each test runs the image as the DaemonSet would run its
command (the entrypoint, the ConfigMap's drop-ins, the probes' exact commands), in a
container of its own with its own network namespace (`--network none`), so it
manages nothing of this machine. What a privileged pod on a real node does with the
host's devices is the package's job, which tests/lab shows on a real kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.deploy.conftest import DEPLOY, missing, require_tool

REPO = DEPLOY.parent
HINT = "bash scripts/fleet-deps.sh installs podman, runc and debootstrap (as root)"
BUILD_TIMEOUT = 1200.0  # the .deb (cached by then in CI), debootstrap, podman build
READY_WITHIN = 60.0
# podman's default limits (nofile, nproc) are above the hard limits of a machine that is
# itself a container without CAP_SYS_RESOURCE, and runc then fails to start; these fit.
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
DAEMONSET = DEPLOY / "kubernetes" / "daemonset-gpu.yaml"
CONFIGMAP = DEPLOY / "kubernetes" / "configmap-gpu.yaml"

pytestmark = pytest.mark.timeout(1800)


def podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    # runc, as scripts/build-image.sh explains.
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def image() -> str:
    require_tool("podman", HINT)
    require_tool("runc", HINT)
    require_tool("debootstrap", HINT)
    if os.geteuid() != 0:
        missing("building the image needs root (debootstrap, podman's system store)")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.strip().splitlines()[-1]


def probe_commands() -> dict[str, list[str]]:
    """The DaemonSet's liveness and readiness commands, exactly as written there."""
    doc = yaml.safe_load(DAEMONSET.read_text())
    container = doc["spec"]["template"]["spec"]["containers"][0]
    return {
        kind: container[f"{kind}Probe"]["exec"]["command"] for kind in ("liveness", "readiness")
    }


@pytest.fixture
def configmap_dir(tmp_path: Path) -> Path:
    """The ConfigMap's data as the kubelet mounts it: one file per key."""
    doc = yaml.safe_load(CONFIGMAP.read_text())
    out = tmp_path / "rdmad.d"
    out.mkdir()
    for name, text in doc["data"].items():
        (out / name).write_text(text)
    return out


class Pod:
    """The image's entrypoint running detached, removed at the end even on failure."""

    def __init__(self, image: str, volumes: list[str]) -> None:
        self.name = f"rdmad-test-{uuid.uuid4().hex[:8]}"
        args = ["run", "-d", "--name", self.name, *LIMITS, "--network", "none"]
        for volume in volumes:
            args += ["-v", volume]
        started = podman(*args, image)
        assert started.returncode == 0, started.stderr

    def exec(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, timeout=30.0)

    def wait_answering(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        """`command`'s result once the daemon answers on its socket (rdmad-ctl exit 3
        means it does not yet), bounded."""
        deadline = time.monotonic() + READY_WITHIN
        while True:
            done = self.exec(command)
            if done.returncode != 3 or time.monotonic() > deadline:
                return done
            time.sleep(0.2)

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name)


@pytest.fixture
def pods(image: str) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.remove()


def test_the_image_holds_the_projects_version(image: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = podman("run", "--rm", *LIMITS, "--network", "none", "--entrypoint", "rdmad", image,
                  "--version")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert project in done.stdout
    assert image.rsplit(":", 1)[1].startswith(project)


def test_the_configmap_is_a_valid_config_in_the_image(image: str, configmap_dir: Path) -> None:
    done = podman(
        "run", "--rm", *LIMITS, "--network", "none",
        "-v", f"{configmap_dir}:/etc/rdmad/rdmad.d:ro",
        "--entrypoint", "rdmad", image, "check-config", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    files = json.loads(done.stdout)["files"]
    assert "/etc/rdmad/rdmad.d/50-node-group.toml" in files


def test_the_daemon_starts_answers_both_probes_and_stops_on_sigterm(
    image: str, pods: list[Pod]
) -> None:
    # Nothing declared (the package's empty rdmad.toml): converged at once.
    pod = Pod(image, [])
    pods.append(pod)
    probes = probe_commands()
    ready = pod.wait_answering(probes["readiness"])
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert pod.exec(probes["liveness"]).returncode == 0
    status = json.loads(pod.exec(["rdmad-ctl", "--json", "status"]).stdout)
    assert status["converged"] is True
    assert status["daemon"]["ready"] is True
    # The kubelet stops a pod with SIGTERM: rdmad ends cleanly, not killed at the grace.
    stopped = podman("stop", "-t", "20", pod.name, timeout=60.0)
    assert stopped.returncode == 0, stopped.stderr
    code = podman("inspect", "-f", "{{.State.ExitCode}}", pod.name)
    assert code.stdout.strip() == "0"
    logs = podman("logs", pod.name)
    assert "agent.ready" in logs.stdout + logs.stderr


def test_a_node_without_the_groups_pf_is_alive_not_ready_and_says_why(
    image: str, pods: list[Pod], configmap_dir: Path
) -> None:
    # The ConfigMap's PF (0000:3b:00.0) is not in this container: the pod must stay up
    # (liveness) and show not ready, with the reason in status, not crash-loop.
    pod = Pod(image, [f"{configmap_dir}:/etc/rdmad/rdmad.d:ro"])
    pods.append(pod)
    probes = probe_commands()
    ready = pod.wait_answering(probes["readiness"])
    assert ready.returncode == 1, ready.stdout + ready.stderr
    assert "PF 0000:3b:00.0 is not present" in ready.stdout
    assert pod.exec(probes["liveness"]).returncode == 0
    status = json.loads(pod.exec(["rdmad-ctl", "--json", "status"]).stdout)
    assert status["converged"] is False
    assert status["daemon"]["config_ok"] is True
