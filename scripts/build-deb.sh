#!/usr/bin/env bash
# Build one rdmad .deb from a copy of the tree, into dist/ (git-ignored).
#
#   bash scripts/build-deb.sh [--target RELEASE] [--arch amd64|arm64] [--version VERSION | --version-suffix SUFFIX] [--out DIR]
#
# RELEASE names a deb target of packaging/targets.toml (default debian12), --arch the
# architecture (default this machine's; arm64 builds anywhere: nothing is compiled).
# Prints the .deb's path on stdout. A build is cached in DIR/cache/KEY/, KEY a hash
# of every input file (tracked and untracked, not ignored), the target, the
# architecture, the version and the last commit's time (the files' dates): the same
# inputs give the same .deb without rebuilding. The version is the newest entry of
# packaging/deb/debian/changelog (its upstream part must match [project].version) with
# the target's suffix, 0.1.0-1~deb12; --version builds another; --version-suffix
# appends to that one (the lab's upgrade test: +lab1). Needs dpkg-dev, debhelper,
# python3-venv (run scripts/pkg-deps.sh as root) and PyPI access (the lock files are
# hash-checked).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

version=""
suffix=""
target=debian12
arch=$(dpkg --print-architecture)
out=$repo/dist
while [[ $# -gt 0 ]]; do
    case $1 in
        --version) version=$2; shift 2 ;;
        --version-suffix) suffix=$2; shift 2 ;;
        --target) target=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: build-deb.sh [--target RELEASE] [--arch ARCH] [--version VERSION | --version-suffix SUFFIX] [--out DIR]" >&2; exit 2 ;;
    esac
done
log() { echo "build-deb: $*" >&2; }

changelog_version=$(dpkg-parsechangelog -l packaging/deb/debian/changelog -S Version)
project_version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
[[ ${changelog_version%%-*} == "$project_version" ]] || {
    log "packaging/deb/debian/changelog ($changelog_version) does not match pyproject.toml ($project_version)"
    exit 1
}
eval "$(python3 packaging/targets.py show "$target" "$arch")"
[[ $t_format == deb ]] || { log "$target is not a deb target (packaging/targets.toml)"; exit 2; }
version=${version:-$changelog_version$t_release$suffix}

# The inputs: what git would commit (so a dirty tree builds what it shows), and the
# time every file in the package carries (SOURCE_DATE_EPOCH, the last commit's): a tree
# built before its commit is not the same .deb as that tree built after it.
mapfile -d '' existing < <(bash scripts/tree-files.sh)
epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)
key=$({ echo "version=$version target=$target arch=$t_deb_arch epoch=$epoch"; sha256sum "${existing[@]}"; } |
    sha256sum | cut -c1-16)
cache=$out/cache/$key
if compgen -G "$cache/rdmad_*.deb" >/dev/null; then
    log "cached: $cache"
    ls "$cache"/rdmad_*.deb
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rdmad-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/rdmad-$project_version
mkdir -p "$src"
tar -cf - "${existing[@]}" | tar -C "$src" -xf -
rm -rf "$src/debian"
cp -a packaging/deb/debian "$src/debian"
if [[ $version != "$changelog_version" ]]; then
    { cat <<CL
rdmad ($version) unstable; urgency=medium

  * Built as $version for $target (packaging/targets.toml).

 -- $(dpkg-parsechangelog -l packaging/deb/debian/changelog -S Maintainer)  $(date -R -d "@$epoch")

CL
      cat packaging/deb/debian/changelog; } >"$src/debian/changelog"
fi
log "dpkg-buildpackage $version ($target, $t_deb_arch) in $src"
# The system python3 and tools, not a developer venv's. -d: a foreign architecture's
# build dependencies are this machine's tools (nothing is compiled for it).
(cd "$src" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin RDMAD_TARGET="$target" \
    SOURCE_DATE_EPOCH="$epoch" dpkg-buildpackage -us -uc -b -d --host-arch "$t_deb_arch" >"$work/build.log" 2>&1) || {
    tail -40 "$work/build.log" >&2
    log "dpkg-buildpackage failed (log above)"
    exit 1
}
mkdir -p "$cache.tmp"
mv "$work"/rdmad_*.deb "$work"/rdmad_*.buildinfo "$work"/rdmad_*.changes "$cache.tmp/"
cp "$work/build.log" "$cache.tmp/"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
ls "$cache"/rdmad_*.deb
