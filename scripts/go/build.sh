#!/usr/bin/env bash
# Build the Go test clients (clients/go: one binary, vwclient, with the subcommands informer and
# reconciler) and cache the binary outside the repository.
#
#   scripts/go/build.sh           build (or reuse) and print the binary's path on stdout
#   scripts/go/build.sh --check   gofmt -l and go vet (no binary); fails on findings
#
# Dependencies come from the Go module proxy, pinned by clients/go/go.mod and go.sum
# (-mod=readonly: a build never edits them). The cache key hashes the Go version, go.mod, go.sum
# and every .go file (names and contents): <cache root>/go-clients/<key>/vwclient, see
# scripts/lib/cache.sh. Progress goes to stderr; only the path goes to stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"
cd "$here/../../clients/go"

export CGO_ENABLED=0  # also for vet: the same build configuration reuses Go's build cache
export GOFLAGS=-mod=readonly

if [[ "${1:-}" == "--check" ]]; then
  unformatted=$(gofmt -l .)
  if [[ -n "$unformatted" ]]; then
    echo "gofmt: not formatted: $unformatted" >&2
    exit 1
  fi
  go vet ./...
  exit 0
fi

mapfile -t sources < <(find . -name '*.go' -not -path './vendor/*' | LC_ALL=C sort)
key=$({ go env GOVERSION; printf '%s\n' "${sources[@]}"; cat go.mod go.sum "${sources[@]}"; } | vw_hash)
out_dir="$(vw_cache_root)/go-clients/$key"
bin="$out_dir/vwclient"

if [[ -x "$bin" ]]; then
  echo "go clients: using cached binary $bin" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$out_dir"
echo "go clients: building into $out_dir (the first build compiles client-go and controller-runtime: minutes on 2 cores)" >&2
start=$(date +%s)
tmp="$out_dir/vwclient.tmp.$$"
trap 'rm -f "$tmp"' EXIT
go build -trimpath -ldflags="-s -w" -o "$tmp" ./cmd/vwclient
mv "$tmp" "$bin"
echo "go clients: built in $(( $(date +%s) - start ))s -> $bin" >&2
echo "$bin"
