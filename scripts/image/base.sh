#!/usr/bin/env bash
# The base image for the build: print the image reference to pass as the Dockerfile's
# PYTHON_IMAGE build argument.
#
#   scripts/image/base.sh
#
# $PYTHON_IMAGE when set; else the Dockerfile's default (python:3.11...-slim, pinned by digest)
# when podman has it or can pull it; else a local base assembled from Debian packages with
# mmdebstrap — Debian bookworm's Python 3.11 (trixie has 3.13), venv, pip and CA certificates —
# and imported into podman as localhost/vwserver-base:KEY. KEY is a hash of the recipe below
# (suite, mirrors, packages, options): the root filesystem tarball is cached in
# <cache root>/image-base/KEY/ and built only when that recipe changes (delete the directory to
# take newer Debian packages). Progress goes to stderr; only the reference goes to stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
vw_need_podman

if [[ -n "${PYTHON_IMAGE:-}" ]]; then
  echo "$PYTHON_IMAGE"
  exit 0
fi

default=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$here/../../Dockerfile")
if podman image exists "$default" 2>/dev/null \
  || timeout 120 podman pull --quiet "$default" >/dev/null 2>&1; then
  echo "$default"
  exit 0
fi

suite=bookworm
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
# python-is-python3: the Dockerfile runs `python`, as in the python image.
packages=python3.11,python3.11-venv,python3-pip,python-is-python3,ca-certificates
# No documentation, manual pages or translations in the image (the copyright files stay).
options=(
  --variant=minbase
  --format=tar
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --include="$packages"
)
# The image's configuration (podman import --change): what the python image sets.
changes=(
  "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  "ENV LANG=C.UTF-8"
  'CMD ["python3"]'
)
key=$(printf '%s\n' "$suite" "${mirrors[@]}" "${options[@]}" "${changes[@]}" | vw_hash)
ref="localhost/vwserver-base:$key"
if podman image exists "$ref"; then
  echo "$ref"
  exit 0
fi
echo "base image $default cannot be pulled: assembling $ref" >&2

dir="$(vw_cache_root)/image-base/$key"
tarball="$dir/rootfs.tar"
if [[ ! -s "$tarball" ]]; then
  mkdir -p "$dir"
  # Another build may run at once: each writes its own temporary file; the rename is atomic.
  tmp=$(mktemp "$dir/rootfs.tar.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  echo "mmdebstrap $suite ($packages) into $tarball" >&2
  mmdebstrap --quiet "${options[@]}" "$suite" "$tmp" "${mirrors[@]}" >&2
  mv -f "$tmp" "$tarball"
fi
change_args=()
for c in "${changes[@]}"; do change_args+=(--change "$c"); done
podman import --quiet "${change_args[@]}" "$tarball" "$ref" >/dev/null
echo "$ref"
