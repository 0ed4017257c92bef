#!/usr/bin/env bash
# Build rdmad's container image (deploy/kubernetes/Containerfile) from the project's
# .deb, pulling nothing from a container registry: the base is a Debian minbase made
# with debootstrap from the mirror this machine's apt already uses, imported into
# podman as localhost/rdmad-base:bookworm (kept; --new-base makes it again).
#
#   bash scripts/build-image.sh [--save FILE] [--new-base]
#
# Prints the image name (localhost/rdmad:VERSION) on stdout; --save also writes it as
# an OCI archive, for `podman load` / `skopeo copy` into a cluster's own registry.
# Needs root, podman, runc and debootstrap (scripts/fleet-deps.sh installs them), and the
# packaging tools of scripts/build-deb.sh (the .deb is built here when not cached).
set -euo pipefail
cd "$(dirname "$0")/.."

save=""
new_base=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --save) save=$(realpath -m "$2"); shift 2 ;;
        --new-base) new_base=1; shift ;;
        *) echo "usage: build-image.sh [--save FILE] [--new-base]" >&2; exit 2 ;;
    esac
done
log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (debootstrap, podman's system store)"
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || die "no $tool: run scripts/fleet-deps.sh as root"
done

SUITE=bookworm
BASE=localhost/rdmad-base:$SUITE
# debootstrap's downloaded packages, kept between builds.
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/rdmad-image/debs
# runc, not crun (podman's default): crun refuses a host whose cgroups are in hybrid mode
# (v1 controllers and a v2 tree), as Debian 12 machines booted that way are.
podman() { command podman --runtime runc "$@"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdmad-image.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT

log "the .deb (scripts/build-deb.sh)"
deb=$(bash scripts/build-deb.sh | tail -n 1)
version=$(dpkg-deb -f "$deb" Version)
# An image tag allows [A-Za-z0-9_.-]: a Debian version's "~" (0.1.0-1~deb12) becomes "_".
image=localhost/rdmad:${version//\~/_}

if [[ $new_base == 1 ]] || ! podman image exists "$BASE"; then
    old_base=$(podman image inspect -f '{{.Id}}' "$BASE" 2>/dev/null || true)
    mirror=$(bash scripts/debian-mirror.sh "$SUITE")
    mkdir -p "$CACHE"
    log "base: debootstrap --variant=minbase $SUITE (mirror from this machine's apt sources)"
    debootstrap --variant=minbase --cache-dir="$CACHE" "$SUITE" "$work/rootfs" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
    # What a slim base leaves out: package downloads and lists (the build fetches its own).
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
    log "base: podman import as $BASE"
    tar -C "$work/rootfs" --numeric-owner -c . \
        | podman import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf --one-file-system "$work/rootfs"
    if [[ -n $old_base ]]; then
        # Images built on the old base still use it; it goes when they do.
        podman rmi "$old_base" >/dev/null 2>&1 || true
    fi
fi

# The image this tag named before, removed once the new one has the tag (no pile of
# untagged 300 MB images after many builds); nothing else in the store is touched.
old_id=$(podman image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)

log "image: podman build $image from deploy/kubernetes/Containerfile"
mkdir "$work/context"
cp deploy/kubernetes/Containerfile "$deb" "$work/context/"
# The host's network: the build's apt-get reaches the same mirror the base was made from.
podman build --network=host --pull=never --build-arg "BASE=$BASE" \
    --label "org.opencontainers.image.version=$version" \
    -t "$image" -f "$work/context/Containerfile" "$work/context" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; die "podman build failed"; }

new_id=$(podman image inspect -f '{{.Id}}' "$image")
if [[ -n $old_id && $old_id != "$new_id" ]]; then
    podman rmi "$old_id" >/dev/null 2>&1 || log "note: the previous $image ($old_id) is still in use; kept"
fi

if [[ -n $save ]]; then
    log "saving $image to $save"
    rm -f "$save"
    podman save --format oci-archive -o "$save" "$image"
fi
log "built $image ($(podman image inspect -f '{{.Size}}' "$image" | numfmt --to=si))"
echo "$image"
