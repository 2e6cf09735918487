#!/usr/bin/env bash
# Build the base image `tidewater-base:bookworm` without a container registry:
# debootstrap a Debian bookworm minbase with python3 + python3-venv, then
# `docker import` the tree. Used by `make image` when python:3.11-slim can be
# neither found locally nor pulled.
#
# SPARK=1 builds `tidewater-base-spark:bookworm` instead: the same plus a Java
# runtime (openjdk-17-jre-headless) and procps, for the image of the compose
# `spark` profile (a Spark master and workers, and the audit's driver).
#
# Cached: does nothing when the image already exists (FORCE=1 rebuilds).
# Mirror: $DEBIAN_MIRROR, else the Debian mirror this host's apt uses, else
# http://deb.debian.org/debian. Needs root (debootstrap chroots).
set -euo pipefail

SUITE=bookworm
HERE="$(cd "$(dirname "$0")" && pwd)"
PACKAGES=python3,python3-venv
if [ "${SPARK:-0}" = 1 ]; then
  IMAGE="${BASE_IMAGE_TAG:-tidewater-base-spark:bookworm}"
  PACKAGES=$PACKAGES,openjdk-17-jre-headless,procps
  ROOTFS="${BASE_ROOTFS_DIR:-$HERE/.base/rootfs-spark}"
else
  IMAGE="${BASE_IMAGE_TAG:-tidewater-base:bookworm}"
  ROOTFS="${BASE_ROOTFS_DIR:-$HERE/.base/rootfs}"
fi

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base-image: $IMAGE exists (FORCE=1 to rebuild)"
  exit 0
fi

# The first Debian (non-security) mirror in the host's apt sources, in either
# the one-line or the deb822 format.
host_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" && $0 ~ /bookworm([ \t]|$)/ {
           for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; exit }
         }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # Paragraphs separated by blank lines; take URIs of one whose Suites has
    # plain "bookworm".
    awk 'BEGIN { RS = ""; FS = "\n" }
         {
           uri = ""; ok = 0
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
             if ($i ~ /^Suites:/ && $i ~ /[ \t]bookworm([ \t]|$)/) ok = 1
           }
           if (ok && uri != "") { print uri; exit }
         }' "$f"
  done
}

MIRROR="${DEBIAN_MIRROR:-$(host_mirror | head -n 1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "base-image: installing debootstrap"
  apt-get install -y debootstrap >/dev/null || { apt-get update >/dev/null && apt-get install -y debootstrap >/dev/null; }
fi

echo "base-image: debootstrap $SUITE from $MIRROR into $ROOTFS"
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"
debootstrap --variant=minbase --include="$PACKAGES" \
  "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2
    echo "base-image: debootstrap failed (full log: $ROOTFS.log)" >&2
    exit 1
  }

# Smaller image: no package lists, caches or docs are needed at run time.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
  "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/usr/share/doc/* \
  "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*

echo "base-image: importing $IMAGE"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
rm -rf "$ROOTFS"
echo "base-image: built $IMAGE"
