# shellcheck shell=bash
# Shared by scripts/image/*.sh: podman (and what it builds with) installed, and this project's
# podman settings. Source it; it installs the Debian packages when a command is missing and
# exports CONTAINERS_CONF.

vw_image_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/cache.sh
source "$vw_image_dir/../lib/cache.sh"

export CONTAINERS_CONF="$vw_image_dir/containers.conf"

# podman builds (buildah), runs containers with runc (containers.conf), and the local base image
# is assembled with mmdebstrap. Debian packages, installed once (quietly) where one is missing.
vw_need_podman() {
  local missing=() cmd
  for cmd in podman buildah runc mmdebstrap; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "installing ${missing[*]} (Debian packages)" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "scripts/image: ${missing[*]} missing and not root: apt-get install podman runc buildah mmdebstrap" >&2
    return 1
  fi
  local log
  log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      podman runc buildah mmdebstrap; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
