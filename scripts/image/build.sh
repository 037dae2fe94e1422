#!/usr/bin/env bash
# Build vwserver's container image from the Dockerfile with podman (`make image`) and print its
# reference, localhost/vwserver:KEY, on stdout (also tagged localhost/vwserver:latest).
#
#   scripts/image/build.sh
#
# KEY is a hash of this script, of the build context the Dockerfile uses (.dockerignore's
# allow-list: requirements-runtime.lock, pyproject.toml, README.md, vwserver/; and the Dockerfile)
# and of the base image's ID, so an unchanged tree reuses the image and a change rebuilds it
# (podman's layer cache keeps the dependency layer while only vwserver/ changed).
#
# The base: scripts/image/base.sh (the Dockerfile's default, or a local Debian base where that
# cannot be pulled). pip inside the build trusts this machine's CA bundle (the build secret
# pip-ca, see the Dockerfile): mounted for the RUN steps only, never stored in the image.
# $PIP_CA overrides the bundle (default: pip's own `cert` setting here, else the system bundle).
# Builds use chroot isolation (no nested user namespaces or cgroups needed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
vw_need_podman

base=$("$here/base.sh")
base_id=$(podman image inspect --format '{{.Id}}' "$base")

cd "$repo"
key=$(
  {
    echo "$base_id"
    find scripts/image/build.sh Dockerfile .dockerignore requirements-runtime.lock pyproject.toml \
      README.md vwserver \
      -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum
  } | vw_hash
)
ref="localhost/vwserver:$key"
if ! podman image exists "$ref"; then
  ca=${PIP_CA:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
  ca=${ca:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
  secret=()
  if [[ -r "$ca" ]]; then
    secret=(--secret "id=pip-ca,src=$ca" --build-arg PIP_CERT=/run/secrets/pip-ca)
  fi
  echo "podman build $ref (base $base)" >&2
  podman build --quiet --isolation=chroot --pull=never \
    --build-arg "PYTHON_IMAGE=$base" "${secret[@]}" \
    --label "io.vwserver.build-key=$key" --label "io.vwserver.base=$base" \
    --tag "$ref" . >&2
fi
podman tag "$ref" localhost/vwserver:latest
echo "$ref"
