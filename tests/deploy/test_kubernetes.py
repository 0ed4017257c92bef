"""Structural checks of deploy/kubernetes, offline (PyYAML, no cluster).

What is checked: each document's apiVersion/kind, namespaces, the DaemonSet's
selector matching its pod labels, host namespaces, the privileged container, every
volumeMount naming a defined volume, the host paths rdmad needs, both probes, and
that each ConfigMap's TOML passes `rdmad check-config`. The Kubernetes OpenAPI schema
itself (strict, offline): test_kubernetes_schema.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY

K8S = DEPLOY / "kubernetes"
KINDS = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "ConfigMap": "v1",
    "DaemonSet": "apps/v1",
}
HOST_PATHS = {"/sys", "/dev", "/run/udev", "/lib/modules", "/etc/modprobe.d", "/run/rdmad"}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def test_every_document_has_a_known_kind_and_api_version() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} == set(KINDS)
    for d in docs:
        assert d["apiVersion"] == KINDS[d["kind"]], d["metadata"]["name"]
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "rdmad"


@pytest.mark.parametrize("ds", of_kind("DaemonSet"), ids=lambda d: d["metadata"]["name"])
def test_daemonset(ds: dict[str, Any]) -> None:
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = container["volumeMounts"]
    assert {m["name"] for m in mounts} <= set(volumes)
    host = {
        volumes[m["name"]]["hostPath"]["path"] for m in mounts if "hostPath" in volumes[m["name"]]
    }
    assert host >= HOST_PATHS
    for probe in ("livenessProbe", "readinessProbe"):
        assert "rdmad-ctl status" in " ".join(container[probe]["exec"]["command"])
    config = [v["configMap"]["name"] for v in volumes.values() if "configMap" in v]
    assert config and set(config) <= {c["metadata"]["name"] for c in of_kind("ConfigMap")}
    # The guard's host copy: a directory the host sees at the same path (the host's
    # modprobe runs the hook that names it), so under a hostPath mounted where it lies.
    command = container["command"]
    kit = command[command.index("--guard-kit") + 1]
    same_path = [
        m["mountPath"]
        for m in mounts
        if "hostPath" in volumes[m["name"]]
        and volumes[m["name"]]["hostPath"]["path"] == m["mountPath"]
        and not m.get("readOnly")
    ]
    assert any(kit == p or kit.startswith(p.rstrip("/") + "/") for p in same_path), kit


@pytest.mark.parametrize("cm", of_kind("ConfigMap"), ids=lambda d: d["metadata"]["name"])
def test_configmap_gives_the_api_group_by_number(cm: dict[str, Any]) -> None:
    """The socket is in a host directory: its group must be the host's, by number."""
    import tomllib

    for text in cm["data"].values():
        group = tomllib.loads(text).get("api", {}).get("read_group")
        assert group is not None and group.isdigit(), group


@pytest.mark.parametrize("cm", of_kind("ConfigMap"), ids=lambda d: d["metadata"]["name"])
def test_configmap_toml_is_valid(cm: dict[str, Any], tmp_path: Path) -> None:
    for name, text in cm["data"].items():
        assert name.endswith(".toml")
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run(
            [sys.executable, "-m", "rdmad.cli", "check-config", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
