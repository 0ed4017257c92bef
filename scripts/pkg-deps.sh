#!/usr/bin/env bash
# Install what building and checking the packages needs (Debian 12, as root):
# dpkg-dev + debhelper (the .deb), rpm (rpmbuild for the .rpm), lintian, rpmlint,
# python3-venv (the build tools run in a venv of the system python3), zsh and fish (the
# packaged completions are tried in each shell: tests/ctl/test_completion.py).
# A no-op when everything is there.
set -euo pipefail

need=()
for pair in dpkg-buildpackage:dpkg-dev dh:debhelper fakeroot:fakeroot rpmbuild:rpm \
    lintian:lintian rpmlint:rpmlint zsh:zsh fish:fish; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
    echo "pkg-deps: missing ${need[*]}; run as root: apt-get install ${need[*]}" >&2
    exit 1
fi
echo "pkg-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
