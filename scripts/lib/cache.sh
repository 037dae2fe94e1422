# shellcheck shell=bash
# Shared by the scripts that build Go binaries from the Go module proxy and cache them outside the
# repository (scripts/kcp/build.sh, scripts/go/build.sh). Source it; it defines functions only.
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
