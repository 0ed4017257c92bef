#!/usr/bin/env bash
# Install what tests/deploy needs: promtool (Debian's `prometheus` package, as root)
# for the alerting rule tests, and ansible-core (PyPI) in its own ./.venv-ansible so
# that rdmad's venv and its runtime lock stay as they are. A no-op when both are there.
set -euo pipefail
cd "$(dirname "$0")/.."

# ansible-core first: it needs no root, so a non-root run still gets it.
if [[ ! -x .venv-ansible/bin/ansible-playbook ]]; then
    echo "fleet-deps: creating .venv-ansible with ansible-core" >&2
    python3 -m venv .venv-ansible
    .venv-ansible/bin/python -m pip install -q "ansible-core>=2.15,<2.18"
fi

if ! command -v promtool >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "fleet-deps: missing promtool; run as root: apt-get install prometheus" >&2
        exit 1
    fi
    echo "fleet-deps: installing prometheus (for promtool)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
