# shellcheck shell=bash
# Shared by the scripts that build Go binaries from the Go module proxy and cache them outside the
# repository (scripts/kcp/build.sh, scripts/go/build.sh, scripts/tools/build.sh). Source it; it
# defines functions only.
#
# Cache root: $VWSERVER_CACHE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/vwserver. A binary lives
# in <root>/<kind>/<key>/, where the key is a hash of what it is built from, so a change to the
# pins (or sources) builds anew and an unchanged tree reuses the binary.

vw_cache_root() {
  echo "${VWSERVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vwserver}"
}

# The cache key of stdin: the first 12 hex digits of its SHA-256.
vw_hash() {
  sha256sum | cut -c1-12
}

# vw_go_build_cached LABEL BIN PKG LDFLAGS: print BIN's path, building Go package PKG (in the
# current module) into BIN first unless it is already there. Safe when two builds run at once:
# each links into a temporary file of its own and renames it into place. Progress to stderr.
vw_go_build_cached() {
  local label=$1 bin=$2 pkg=$3 ldflags=$4 start tmp
  if [[ -x "$bin" ]]; then
    echo "$label: using cached $(basename "$bin") $bin" >&2
  else
    mkdir -p "$(dirname "$bin")"
    echo "$label: building $(basename "$bin") into $(dirname "$bin") (a first build takes minutes on 2 cores)" >&2
    start=$(date +%s)
    tmp="$bin.tmp.$$"
    # shellcheck disable=SC2064  # the path now: tmp is local to this function
    trap "rm -f '$tmp'" EXIT
    go build -trimpath -ldflags="-s -w $ldflags" -o "$tmp" "$pkg"
    mv "$tmp" "$bin"
    echo "$label: built $(basename "$bin") in $(( $(date +%s) - start ))s -> $bin" >&2
  fi
  echo "$bin"
}
