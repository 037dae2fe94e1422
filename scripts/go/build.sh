#!/usr/bin/env bash
# Build vwserver's Go binaries and cache them outside the repository. Two Go modules:
#
#   clients/go           vwclient: the Go test clients (subcommands informer and reconciler);
#                        client-go v0.37 / controller-runtime v0.25
#   clients/go/provider  vwprovider: the example provider controller on multicluster-runtime
#                        through a slice (package filteredapiexport, the typed slice API);
#                        pinned to what kcp's multicluster-provider v0.8.0 builds with
#                        (controller-runtime v0.24, client-go v0.36), hence a module of its own
#
#   scripts/go/build.sh [vwclient|vwprovider]  build (or reuse) one binary (default vwclient)
#                                              and print its path on stdout
#   scripts/go/build.sh --check                gofmt -l, go vet (both modules) and go test
#                                              (clients/go/provider); fails on findings
#
# Dependencies come from the Go module proxy, pinned by each module's go.mod and go.sum
# (-mod=readonly: a build never edits them). The cache key hashes the Go version, go.mod, go.sum
# and every .go file of the module (names and contents; a nested module's files belong to it
# alone): <cache root>/go-clients/<key>/vwclient and <cache root>/go-provider/<key>/vwprovider,
# see scripts/lib/cache.sh. Progress goes to stderr; only the path goes to stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"
clients="$here/../../clients/go"

export CGO_ENABLED=0  # also for vet and test: the same build configuration reuses Go's build cache
export GOFLAGS=-mod=readonly
# kcp-dev's modules are served by the module proxy, but the checksum database lacks some of them
# (404); their hashes are pinned in go.sum (as for scripts/kcp).
export GONOSUMDB=github.com/kcp-dev

if [[ "${1:-}" == "--check" ]]; then
  for module in "$clients" "$clients/provider"; do
    (
      cd "$module"
      unformatted=$(gofmt -l .)
      if [[ -n "$unformatted" ]]; then
        echo "gofmt: not formatted in $module: $unformatted" >&2
        exit 1
      fi
      go vet ./...
    )
  done
  (cd "$clients/provider" && go test ./...)
  exit 0
fi

binary=${1:-vwclient}
case "$binary" in
  vwclient) module="$clients" kind=go-clients ;;
  vwprovider) module="$clients/provider" kind=go-provider ;;
  *) echo "usage: $0 [vwclient|vwprovider] | --check" >&2; exit 2 ;;
esac
cd "$module"

# The module's own sources: a nested module's directory (a go.mod below the root) is pruned.
mapfile -t sources < <(
  find . -mindepth 1 -type d \( -name vendor -o -exec test -e '{}/go.mod' \; \) -prune \
    -o -name '*.go' -print | LC_ALL=C sort
)
key=$({ go env GOVERSION; printf '%s\n' "${sources[@]}"; cat go.mod go.sum "${sources[@]}"; } | vw_hash)
# A first build compiles client-go and controller-runtime: minutes on 2 cores.
vw_go_build_cached go "$(vw_cache_root)/$kind/$key/$binary" "./cmd/$binary" ""
