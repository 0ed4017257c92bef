"""deploy/kubernetes against the Kubernetes OpenAPI schema, offline.

`kubernetes-validate` (the `test` extra) bundles the JSON schemas of each Kubernetes
release and validates with jsonschema: no cluster, no kubectl, no download (the
network is cut off below while it runs). Strict: a field the schema does not know is an
error, so a misspelt key (`privilegd`) fails instead of being dropped by the API server.
The structural checks that no schema can make are in test_kubernetes.py.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, require_module

# The oldest Kubernetes the manifests are written for (deploy/kubernetes/README.md).
K8S_VERSION = "1.31"
HINT = "bash scripts/setup.sh installs kubernetes-validate (the `test` extra)"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


MANIFESTS = manifests()


@pytest.fixture
def kv(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """kubernetes_validate, with every network connection refused while a test runs."""
    module = require_module("kubernetes_validate", HINT)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("schema validation tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield module


def validate(kv: ModuleType, doc: dict[str, Any], *, strict: bool = True) -> str:
    """The Kubernetes version validated against; raises kv.ValidationError."""
    return str(kv.validate(doc, K8S_VERSION, strict=strict))


def test_the_manifests_are_all_there() -> None:
    kinds = sorted(doc["kind"] for _, doc in MANIFESTS)
    assert kinds == ["ConfigMap", "DaemonSet", "Namespace", "ServiceAccount"], kinds


@pytest.mark.parametrize("doc", [d for _, d in MANIFESTS], ids=[n for n, _ in MANIFESTS])
def test_manifest_is_valid_against_the_stated_kubernetes(kv: ModuleType, doc: dict) -> None:
    try:
        version = validate(kv, doc)
    except kv.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        pytest.fail(f"Kubernetes {K8S_VERSION} schema: {where}: {exc.message}")
    # The schema used is the stated release's own, not an older one standing in for it.
    assert version == K8S_VERSION


def _daemonset() -> dict[str, Any]:
    (ds,) = [copy.deepcopy(d) for _, d in MANIFESTS if d["kind"] == "DaemonSet"]
    return ds


def test_an_unknown_field_is_an_error(kv: ModuleType) -> None:
    ds = _daemonset()
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    with pytest.raises(kv.ValidationError, match="privilegd"):
        validate(kv, ds)
    # Without strict the typo would pass: strict is what catches it.
    assert validate(kv, ds, strict=False) == K8S_VERSION


def test_a_wrong_type_is_an_error(kv: ModuleType) -> None:
    ds = _daemonset()
    ds["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(kv.ValidationError, match="'yes' is not of type 'boolean'"):
        validate(kv, ds)


def test_a_missing_required_field_is_an_error(kv: ModuleType) -> None:
    ds = _daemonset()
    del ds["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(kv.ValidationError, match="'name' is a required property"):
        validate(kv, ds)


def test_a_broken_manifest_file_is_caught(kv: ModuleType, tmp_path: Path) -> None:
    """The whole path a CI run takes (file -> documents -> schema) on a broken copy."""
    text = (DEPLOY / "kubernetes" / "daemonset-gpu.yaml").read_text()
    broken = tmp_path / "daemonset-gpu.yaml"
    broken.write_text(text.replace("hostPID: true", "hostPID: true\n      hostPIDs: true", 1))
    assert broken.read_text() != text
    errors = []
    for doc in yaml.safe_load_all(broken.read_text()):
        try:
            validate(kv, doc)
        except kv.ValidationError as exc:
            errors.append(exc.message)
    assert len(errors) == 1 and "hostPIDs" in errors[0], errors
