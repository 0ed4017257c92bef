#!/usr/bin/env bash
# Install what tests/deploy needs (Debian 12, as root): promtool (Debian's
# `prometheus` package) for the alerting rule tests. A no-op when it is there.
set -euo pipefail

command -v promtool >/dev/null 2>&1 && exit 0
if [[ $(id -u) -ne 0 ]]; then
    echo "fleet-deps: missing promtool; run as root: apt-get install prometheus" >&2
    exit 1
fi
echo "fleet-deps: installing prometheus (for promtool)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
