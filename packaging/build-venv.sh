#!/usr/bin/env bash
# Build rdmad's private virtualenv for a package: DESTDIR/usr/lib/rdmad, plus the
# /usr/bin wrappers of [project.scripts]. Shared by debian/rules and rdmad.spec.
#
#   build-venv.sh SRC DESTDIR [PYTHON]
#
# SRC is a copy of the source tree (setuptools writes build/ and *.egg-info into
# it); PYTHON is the interpreter the venv runs on, by the absolute path it has on
# the target system (default /usr/bin/python3.11: Debian 12 and RHEL 9 alike).
# Every dependency comes from packaging/requirements.lock and every build tool
# from packaging/build-requirements.lock, all with --require-hashes; nothing is
# fetched at install time. The .pyc files are compiled here (checked-hash, so
# they do not depend on file times), because a node should not compile at boot.
set -euo pipefail

src=$(cd "$1" && pwd)
destdir=$2
python=${3:-/usr/bin/python3.11}
prefix=/usr/lib/rdmad
venv=$destdir$prefix

log() { echo "build-venv: $*" >&2; }
[[ -x $python ]] || { log "$python is missing on the build machine"; exit 1; }

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
# ensurepip installs the pip that ships with this python (offline); the build
# tools and every runtime dependency then come hash-checked from the lock files.
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input --isolated)
log "build tools from packaging/build-requirements.lock"
"${pip[@]}" install -q --require-hashes --no-deps -r "$src/packaging/build-requirements.lock"
log "runtime dependencies from packaging/requirements.lock"
"${pip[@]}" install -q --require-hashes --no-deps --no-build-isolation --prefer-binary \
    -r "$src/packaging/requirements.lock"
log "rdmad from $src"
"${pip[@]}" install -q --no-deps --no-build-isolation --no-index "$src"
# The man pages, from the argument parsers and the config schema of what was just
# installed (rdmad/manpages.py). argparse-manpage is a build tool like the others
# (packaging/docs-requirements.lock; an sdist, built with the setuptools above).
log "man pages"
"${pip[@]}" install -q --require-hashes --no-deps --no-build-isolation \
    -r "$src/packaging/docs-requirements.lock"
(cd / && "$venv/bin/python" -I -m rdmad.manpages "$destdir/usr/share/man" >/dev/null)
# The build tools and pip are not needed to run rdmad.
"${pip[@]}" uninstall -q -y argparse-manpage wheel setuptools packaging pip

site=$(echo "$venv"/lib/python3*/site-packages)
# A venv is not relocatable: replace everything that names the build path.
rm -rf "$venv"/bin "$venv"/include
mkdir -p "$venv/bin"
ln -s "$python" "$venv/bin/python3"
ln -s python3 "$venv/bin/python"
pyver=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
cat >"$venv/pyvenv.cfg" <<CFG
home = $(dirname "$python")
include-system-site-packages = false
version = $pyver
CFG
rm -f "$site"/rdmad-*.dist-info/direct_url.json
# RECORD lists the deleted entry points and pip's own files: drop the stale lines.
sed -i '/^\.\.\/\.\.\/\.\.\/bin\//d; /direct_url.json/d' "$site"/*.dist-info/RECORD
find "$venv" -name __pycache__ -prune -exec rm -rf {} +
# checked-hash: valid whatever the file times; SOURCE_DATE_EPOCH keeps them reproducible.
"$venv/bin/python" -m compileall -q -j0 --invalidation-mode checked-hash \
    -s "$destdir" -p / "$venv/lib" >/dev/null

# /usr/bin wrappers for [project.scripts]: -I keeps PYTHONPATH, the user site
# and the working directory out of a root daemon's imports; argv[0] is the
# command's name, for its usage and help texts.
mkdir -p "$destdir/usr/bin"
"$python" - "$src/pyproject.toml" <<'PY' | while read -r name module func; do
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    for name, target in tomllib.load(f)["project"]["scripts"].items():
        module, func = target.split(":")
        print(name, module, func)
PY
    cat >"$destdir/usr/bin/$name" <<SH
#!/bin/sh
exec $prefix/bin/python3 -I -c 'import sys; sys.argv[0] = "$name"; from $module import $func; sys.exit($func())' "\$@"
SH
    chmod 0755 "$destdir/usr/bin/$name"
done

if grep -rl -- "$destdir" "$venv" "$destdir/usr/bin" >/dev/null 2>&1; then
    grep -rl -- "$destdir" "$venv" "$destdir/usr/bin" >&2
    log "the build path is still named in the files above"
    exit 1
fi
log "venv ready: $(du -sh "$venv" | cut -f1) in $prefix"
