#!/usr/bin/env bash
# Build the kcp server binary from the Go module proxy and cache it outside the repository.
#
#   scripts/kcp/build.sh                 build (or reuse) and print the binary's path on stdout
#   scripts/kcp/build.sh --print-replace VERSION
#                                        print the k8s.io replace block of kcp VERSION's go.mod
#
# The cache key is the kcp version plus a hash of go.mod/go.sum, so editing the pins rebuilds.
# Cache root: $VWSERVER_CACHE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/vwserver.
# Progress goes to stderr; only the path goes to stdout, so callers can do bin=$(build.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"

# kcp-dev's fork and staging modules are served by the module proxy, but the checksum database has
# no entries for most of their pseudo-versions (404). Their hashes are pinned in go.sum instead.
export GONOSUMDB=github.com/kcp-dev
export CGO_ENABLED=0
export GOFLAGS=-mod=mod

if [[ "${1:-}" == "--print-replace" ]]; then
  version=${2:?usage: build.sh --print-replace VERSION}
  mod=$(cd /tmp && go mod download -json "github.com/kcp-dev/kcp@${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  awk '/^replace \(/{n++} n==1{print} n==1 && /^\)/{exit}' "$mod"
  exit 0
fi

version=$(awk '$1=="github.com/kcp-dev/kcp"{print $2; exit}' go.mod)
key=$(cat go.mod go.sum | vw_hash)
cache_root=$(vw_cache_root)
out_dir="$cache_root/kcp/${version}-${key}"
bin="$out_dir/kcp"

if [[ -x "$bin" ]]; then
  echo "kcp ${version}: using cached binary $bin" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$out_dir"
echo "kcp ${version}: building from the Go module proxy into $out_dir" >&2
echo "  (the first build takes a long time on 2 cores; later runs reuse the cache)" >&2
start=$(date +%s)
# Download only the modules cmd/kcp needs (some of kcp's tool dependencies are not served),
# then compile with -v (one line per package).
go list -deps github.com/kcp-dev/kcp/cmd/kcp >/dev/null
tmp="$out_dir/kcp.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# kcp v0.32.3 needs one symbol that the newest published virtual-workspace-framework (v0.31.2)
# lacks (see compat/). The module cache is read-only, so build against a copy of that module with
# the shim added, through a generated go.mod (-modfile) that replaces it with the copy. The copy
# lives in the cache directory, never in the repository.
vwf_version=$(awk '$1=="github.com/kcp-dev/virtual-workspace-framework"{print $2; exit}' go.mod)
vwf_src=$(go mod download -json "github.com/kcp-dev/virtual-workspace-framework@${vwf_version}" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
vwf_copy="$out_dir/virtual-workspace-framework"
rm -rf "$vwf_copy" && cp -r "$vwf_src" "$vwf_copy" && chmod -R u+w "$vwf_copy"
cp compat/forwardingregistry_compat.go "$vwf_copy/pkg/forwardingregistry/zz_vwserver_compat.go"
cp go.mod "$out_dir/build.mod" && cp go.sum "$out_dir/build.sum"
go mod edit -modfile="$out_dir/build.mod" \
  -replace "github.com/kcp-dev/virtual-workspace-framework=$vwf_copy"
# pipefail makes the pipeline fail when go build does; awk only thins out the progress lines.
if ! go build -modfile="$out_dir/build.mod" -v -trimpath -ldflags="-s -w" -o "$tmp" \
  github.com/kcp-dev/kcp/cmd/kcp 2>&1 \
  | awk '/[: ]/ {print; fflush(); next}  # compiler errors pass through whole
         {n++; if (n % 50 == 0) {printf "  compiled %d packages (latest: %s)\n", n, $0; fflush()}}' >&2
then
  echo "kcp build failed (see the errors above)" >&2
  exit 1
fi
mv "$tmp" "$bin"
echo "kcp ${version}: built in $(( $(date +%s) - start ))s -> $bin" >&2
echo "$bin"
