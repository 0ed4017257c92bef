#!/usr/bin/env bash
# Build rdmad's private virtualenv for one package target: DESTDIR/usr/lib/rdmad, the
# /usr/bin wrappers of [project.scripts] and the man pages. Shared by debian/rules and
# rdmad.spec.
#
#   build-venv.sh SRC DESTDIR TARGET ARCH
#
# TARGET names a release of packaging/targets.toml, ARCH is amd64 or arm64 (x86_64,
# aarch64). The venv is for that release's Python, which the build machine need not
# have: uv installs the wheels of packaging/requirements.lock (every file hash
# checked, its markers evaluated for that Python) for the target's Python version and
# platform into the venv's site-packages, and bin/python3 and pyvenv.cfg are written
# here. The build's own tools (setuptools, wheel, uv, argparse-manpage: hash-pinned in
# build-requirements.lock and docs-requirements.lock) live in a throwaway venv of the
# build machine's python3 and never reach the package.
#
# Bytecode is compiled here when the build machine has the target's interpreter, as
# unchecked-hash pycs (PEP 552): valid whatever the file times, and an import reads the
# .pyc alone. A checked-hash pyc makes every import read and hash its source again
# (rdmad imports ~400 modules before its first pass); the sources here change only
# with the package, whose upgrade replaces the pycs with them; otherwise the package compiles it when
# installed (usr/lib/rdmad/COMPILE_AT_INSTALL tells postinst / %post), as Debian's own
# Python packages do.
set -euo pipefail

src=$(cd "$1" && pwd)
# Absolute: steps below run from other directories (debian/rules passes debian/rdmad).
mkdir -p "$2"
destdir=$(cd "$2" && pwd)
eval "$(python3 "$src/packaging/targets.py" show "$3" "$4")"
prefix=/usr/lib/rdmad
venv=$destdir$prefix
site=$venv/lib/python$t_python/site-packages

log() { echo "build-venv: $*" >&2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdmad-venv.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The build tools, in a venv of the build machine's python3 (ensurepip: offline).
tools=$work/tools
python3 -m venv "$tools"
pip=("$tools/bin/python" -m pip --disable-pip-version-check --no-input --isolated)
log "build tools from build-requirements.lock and docs-requirements.lock"
"${pip[@]}" install -q --require-hashes --no-deps -r "$src/packaging/build-requirements.lock"
"${pip[@]}" install -q --require-hashes --no-deps --no-build-isolation \
    -r "$src/packaging/docs-requirements.lock"
log "rdmad's wheel from $src"
"${pip[@]}" wheel -q --no-deps --no-build-isolation --no-index -w "$work/dist" "$src"
wheel=$(echo "$work"/dist/rdmad-*.whl)

log "site-packages for $t_name: CPython $t_python on $t_platform"
rm -rf "$venv"
mkdir -p "$site"
# --no-build-isolation: an sdist of the lock (sdnotify, pure Python) is built with the
# hash-pinned setuptools of the tools venv, never with one fetched on the fly.
uv=("$tools/bin/uv" pip install --no-config --quiet --python "$tools/bin/python"
    --target "$site" --python-version "$t_python" --python-platform "$t_platform"
    --no-build-isolation --no-deps)
export UV_CACHE_DIR=${UV_CACHE_DIR:-$HOME/.cache/rdmad-build/uv}
"${uv[@]}" --require-hashes -r "$src/packaging/requirements.lock"
"${uv[@]}" --no-index "$wheel"
# uv's own lock file of the target directory is no part of the venv; nor is its cache
# record of the wheel it installed (uv_cache.json: the install's time, which made no
# two builds of one tree the same bytes, so the lab's installed state never matched).
rm -rf "$site/bin" "$site/.lock"
rm -f "$site"/*.dist-info/direct_url.json "$site"/*.dist-info/uv_cache.json
sed -i '/direct_url.json/d; /uv_cache.json/d; /^\.\.\/\.\.\/\.\.\/bin\//d; /^bin\//d' "$site"/*.dist-info/RECORD
# Every extension module must be the target's: a wheel built here from source would be
# the build machine's (the lock's compiled packages all have wheels; this says so if
# one ever does not).
"$tools/bin/python" - "$site" "$t_python" "$t_rpm_arch" <<'PY'
import pathlib, sys
site, version, arch = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
machine = {"x86_64": 62, "aarch64": 183}[arch]
tag = f"cpython-{version.replace('.', '')}-{arch}-linux-gnu"
bad = []
for so in site.rglob("*.so"):
    e_machine = int.from_bytes(so.read_bytes()[18:20], "little")
    if e_machine != machine or not (tag in so.name or ".abi3." in so.name):
        bad.append(f"{so.relative_to(site)} (ELF machine {e_machine})")
if bad:
    sys.exit("build-venv: not for " + tag + ": " + ", ".join(bad))
PY

# The venv around it: the target system's interpreter, no path of this machine.
mkdir -p "$venv/bin"
ln -s "$t_interpreter" "$venv/bin/python3"
ln -s python3 "$venv/bin/python"
cat >"$venv/pyvenv.cfg" <<CFG
home = $(dirname "$t_interpreter")
include-system-site-packages = false
version = $t_python
CFG

if [[ -x $t_interpreter ]] &&
    "$t_interpreter" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$t_python'.split('.'))))"; then
    log "bytecode compiled with $t_interpreter"
    "$venv/bin/python3" -m compileall -q -j0 --invalidation-mode unchecked-hash \
        -s "$destdir" -p / "$venv/lib" >/dev/null
else
    log "no $t_interpreter here: the package compiles the bytecode when installed"
    echo "$t_python" >"$venv/COMPILE_AT_INSTALL"
fi

# The man pages, from the parsers and the schema of this rdmad (rdmad/manpages.py),
# run with the tools venv, which gets rdmad and the build machine's wheels for it.
log "man pages"
"${pip[@]}" install -q --require-hashes --no-deps --no-build-isolation \
    -r "$src/packaging/requirements.lock"
"${pip[@]}" install -q --no-deps --no-index "$wheel"
(cd / && "$tools/bin/python" -I -m rdmad.manpages "$destdir/usr/share/man" >/dev/null)
# gzip, as both families ship them (dh_compress and brp-compress leave a .gz alone);
# -n: no name or time inside, the same bytes from the same inputs.
find "$destdir/usr/share/man" -type f ! -name '*.gz' -exec gzip -9n {} +

# /usr/bin wrappers for [project.scripts]: -I keeps PYTHONPATH, the user site
# and the working directory out of a root daemon's imports; argv[0] is the
# command's name, for its usage and help texts.
mkdir -p "$destdir/usr/bin"
"$tools/bin/python" - "$src/pyproject.toml" <<'PY' | while read -r name module func; do
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
log "venv ready: $(du -sh "$venv" | cut -f1) in $prefix (CPython $t_python, $t_rpm_arch)"
