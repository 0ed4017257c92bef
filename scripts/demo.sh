#!/usr/bin/env bash
# Set up rdmad and show its main job: validate a declaration, observe a node
# (a fake mlx5 + igb node shipped with the tests), and print the exact plan.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
.venv/bin/python -m tests.support.fakesysfs "$root"

echo "\$ rdmad check-config --config tests/fixtures/demo-node.toml"
.venv/bin/rdmad check-config --config tests/fixtures/demo-node.toml
echo
echo "\$ rdmad plan --root <fake node> --config tests/fixtures/demo-node.toml"
.venv/bin/rdmad plan --root "$root" --config tests/fixtures/demo-node.toml
