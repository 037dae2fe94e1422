#!/usr/bin/env bash
# Run a command with kcp in a container for the e2e suite's testcontainers path:
#
#   scripts/image/with-podman-api.sh COMMAND [ARG...]
#
# Starts podman's Docker-compatible API (`podman system service`) on a socket of its own, and runs
# COMMAND with DOCKER_HOST pointing at it and KCP_IMAGE set (default: the image that
# scripts/image/kcp-image.sh builds from the cached kcp binary; set KCP_IMAGE to use another).
# The service is stopped when COMMAND ends; COMMAND's exit code is the script's.
# Ryuk (testcontainers' reaper of leaked containers) is off: its image comes from a registry,
# and no registry is reachable here; the fixture removes its container itself (tests/conftest.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
vw_need_podman
[[ $# -gt 0 ]] || { echo "usage: with-podman-api.sh COMMAND [ARG...]" >&2; exit 2; }

export KCP_IMAGE=${KCP_IMAGE:-$("$here/kcp-image.sh")}
dir=$(mktemp -d)
socket="$dir/podman.sock"
podman system service --time=0 "unix://$socket" >"$dir/service.log" 2>&1 &
service=$!
cleanup() {
  kill "$service" 2>/dev/null || true
  wait "$service" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
  [[ -S "$socket" ]] && curl -fsS --unix-socket "$socket" http://podman/_ping >/dev/null 2>&1 && break
  kill -0 "$service" 2>/dev/null || { cat "$dir/service.log" >&2; exit 1; }
  sleep 0.2
done
curl -fsS --unix-socket "$socket" http://podman/_ping >/dev/null \
  || { echo "podman system service did not answer on $socket" >&2; cat "$dir/service.log" >&2; exit 1; }
export DOCKER_HOST="unix://$socket"
export TESTCONTAINERS_RYUK_DISABLED=true
echo "kcp from image $KCP_IMAGE via podman's API at $DOCKER_HOST" >&2
set +e
"$@"
rc=$?
set -e
exit "$rc"
