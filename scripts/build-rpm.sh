#!/usr/bin/env bash
# Build one rdmad .rpm (packaging/rpm/rdmad.spec) from a copy of the tree, into dist/.
#
#   bash scripts/build-rpm.sh [--target el8|el9|el10] [--arch x86_64|aarch64] [--out DIR]
#
# The release and architecture as in build-deb.sh (default el9 and this machine's).
# Prints the .rpm's path on stdout; cached like build-deb.sh (DIR/cache/rpm-KEY/).
# rpmbuild runs with --nodeps: on Debian the RHEL build requirements (python3,
# systemd-rpm-macros) are the system's own python3 and
# packaging/rpm/macros.systemd-fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$PWD/dist
target=el9
arch=$(uname -m)
while [[ $# -gt 0 ]]; do
    case $1 in
        --target) target=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: build-rpm.sh [--target RELEASE] [--arch ARCH] [--out DIR]" >&2; exit 2 ;;
    esac
done
log() { echo "build-rpm: $*" >&2; }
eval "$(python3 packaging/targets.py show "$target" "$arch")"
[[ $t_format == rpm ]] || { log "$target is not an rpm target (packaging/targets.toml)"; exit 2; }

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
mapfile -d '' existing < <(bash scripts/tree-files.sh)
key=$({ echo "target=$target arch=$t_rpm_arch"; sha256sum "${existing[@]}"; } |
    sha256sum | cut -c1-16)
cache=$out/cache/rpm-$key
if compgen -G "$cache/rdmad-*.rpm" >/dev/null; then
    log "cached: $cache"
    ls "$cache"/rdmad-*.rpm
    exit 0
fi

top=$(mktemp -d "${TMPDIR:-/tmp}/rdmad-rpm.XXXXXX")
trap 'rm -rf "$top"' EXIT
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,stage/rdmad-$version}
tar -cf - "${existing[@]}" | tar -C "$top/stage/rdmad-$version" -xf -
tar -C "$top/stage" -czf "$top/SOURCES/rdmad-$version.tar.gz" "rdmad-$version"
cp packaging/requirements.lock "$top/SOURCES/"
# systemd's scriptlet macros, from systemd-rpm-macros where the machine has them.
macros=()
if [[ -z $(rpm --eval '%{?systemd_post:yes}') ]]; then
    log "no systemd-rpm-macros here: packaging/rpm/macros.systemd-fallback stands in"
    macros=(--define "rdmad_fallback_macros $PWD/packaging/rpm/macros.systemd-fallback")
fi
log "rpmbuild rdmad $version ($target, $t_rpm_arch)"
env PATH=/usr/sbin:/usr/bin:/sbin:/bin rpmbuild -bb --nodeps "${macros[@]}" \
    --target "$t_rpm_arch" --define "_topdir $top" --define "rdmad_version $version" \
    --define "rdmad_target $target" --define "rdmad_python $t_python" \
    --define "rdmad_requires $t_requires" --define "dist $t_release" \
    packaging/rpm/rdmad.spec >"$top/build.log" 2>&1 || {
    tail -40 "$top/build.log" >&2
    log "rpmbuild failed (log above)"
    exit 1
}
mkdir -p "$cache.tmp"
mv "$top"/RPMS/*/rdmad-*.rpm "$cache.tmp/"
cp "$top/build.log" "$cache.tmp/"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
ls "$cache"/rdmad-*.rpm
