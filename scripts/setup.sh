#!/usr/bin/env bash
# Make ./.venv with rdmad and its test/dev tools. Works on a fresh Debian 12 as root.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup: $*" >&2; }

if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
        log "python3 with venv is missing; run as root or: apt-get install python3-venv"
        exit 1
    fi
    log "installing python3-venv (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3 python3-venv >/dev/null
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    log "rdmad needs Python >= 3.11, found $(python3 --version)"; exit 1; }

stamp=.venv/.rdmad-deps
want=$(sha256sum pyproject.toml | cut -c1-16)
if [[ -x .venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    exit 0
fi
log "creating .venv and installing rdmad with test and dev extras"
[[ -x .venv/bin/python ]] || python3 -m venv .venv
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { .venv/bin/python -m pip install --upgrade pip "setuptools>=68" wheel &&
       .venv/bin/python -m pip install --no-build-isolation -e '.[test,dev]'; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    log "pip install failed (full log above)"
    exit 1
fi
echo "$want" > "$stamp"
