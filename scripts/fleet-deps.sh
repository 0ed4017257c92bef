#!/usr/bin/env bash
# Install what tests/deploy needs: promtool (Debian's `prometheus` package, as root)
# for the alerting rule tests, podman, runc and debootstrap (as root) for the container
# image, and ansible-core (PyPI) in its own ./.venv-ansible so
# that rdmad's venv and its runtime lock stay as they are. A no-op when all are there.
set -euo pipefail
cd "$(dirname "$0")/.."

# ansible-core first: it needs no root, so a non-root run still gets it.
if [[ ! -x .venv-ansible/bin/ansible-playbook ]]; then
    echo "fleet-deps: creating .venv-ansible with ansible-core" >&2
    python3 -m venv .venv-ansible
    .venv-ansible/bin/python -m pip install -q "ansible-core>=2.15,<2.18"
fi

# Debian packages for each tool: promtool, and what scripts/build-image.sh builds and
# tests/deploy runs the container image with (podman, runc, debootstrap).
declare -A package_of=([promtool]=prometheus [podman]=podman [runc]=runc [debootstrap]=debootstrap)
missing=()
for tool in promtool podman runc debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "fleet-deps: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "fleet-deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
