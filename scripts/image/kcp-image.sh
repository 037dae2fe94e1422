#!/usr/bin/env bash
# A kcp container image built locally from the cached kcp binary (scripts/kcp/build.sh), for the
# e2e suite's testcontainers path (KCP_IMAGE); prints its reference, localhost/vwserver-kcp:KEY.
#
#   scripts/image/kcp-image.sh
#
# No registry is reachable here, so kcp's published image cannot be pulled. kcp is a static Go
# binary (CGO_ENABLED=0): the image is that binary on an empty base, with the directories kcp
# writes to (/data for --root-directory, /tmp). KEY is the kcp cache directory's name (version and
# pins) plus a hash of this recipe: a new kcp build gives a new image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
vw_need_podman

kcp=$("$here/../kcp/build.sh" kcp)
containerfile='FROM scratch
COPY kcp /kcp
COPY data /data
COPY tmp /tmp
ENTRYPOINT ["/kcp"]
CMD ["start", "--root-directory=/data"]'
key="$(basename "$(dirname "$kcp")")-$(printf '%s' "$containerfile" | vw_hash)"
ref="localhost/vwserver-kcp:$key"
if ! podman image exists "$ref"; then
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  ln "$kcp" "$context/kcp" 2>/dev/null || cp "$kcp" "$context/kcp"
  mkdir -m 0755 "$context/data"
  mkdir -m 1777 "$context/tmp"
  printf '%s\n' "$containerfile" >"$context/Containerfile"
  echo "podman build $ref from $kcp" >&2
  podman build --quiet --isolation=chroot --pull=never --tag "$ref" "$context" >&2
fi
echo "$ref"
