#!/usr/bin/env bash
# Build kcp's binaries from the Go module proxy and cache them outside the repository.
#
#   scripts/kcp/build.sh [CMD...]        build (or reuse) kcp's cmd/CMD for each CMD (default:
#                                        kcp) and print each binary's path on stdout, one a line
#   scripts/kcp/build.sh --sharded       the same for the pieces of a sharded kcp: kcp (each shard
#                                        is a `kcp start`), cache-server and kcp-front-proxy
#   scripts/kcp/build.sh --print-replace VERSION
#                                        print the k8s.io replace block of kcp VERSION's go.mod
#
# The cache key is the kcp version plus a hash of go.mod/go.sum, so editing the pins rebuilds.
# Every CMD is built from the same module graph (the same go.mod/go.sum and compat shim), so all
# of them share one cache directory <root>/kcp/<version>-<key>/ (kcp, cache-server, ...).
# The sharded pieces are built one by one rather than as kcp's cmd/sharded-test-server: that
# program starts them on fixed ports (6443, 6444+n, 8012, etcd 2379+) with certificates of its
# own making, which clash with other kcps on a shared machine; devenv/shards.py starts the
# pieces itself on free ports.
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

targets=("$@")
if [[ "${1:-}" == "--sharded" ]]; then
  targets=(kcp cache-server kcp-front-proxy)
elif [[ ${#targets[@]} -eq 0 ]]; then
  targets=(kcp)
fi
for t in "${targets[@]}"; do
  case "$t" in
    kcp | cache-server | kcp-front-proxy | virtual-workspaces) ;;
    *) echo "build.sh: unknown kcp command '$t'" >&2; exit 2 ;;
  esac
done

missing=()
for t in "${targets[@]}"; do
  if [[ -x "$out_dir/$t" ]]; then
    echo "kcp ${version}: using cached binary $out_dir/$t" >&2
  else
    missing+=("$t")
  fi
done

if [[ ${#missing[@]} -gt 0 ]]; then
  mkdir -p "$out_dir"
  echo "kcp ${version}: building ${missing[*]} from the Go module proxy into $out_dir" >&2
  echo "  (the first build takes a long time on 2 cores; later runs reuse the cache)" >&2
  # kcp v0.32.3 needs one symbol that the newest published virtual-workspace-framework (v0.31.2)
  # lacks (see compat/). The module cache is read-only, so build against a copy of that module
  # with the shim added, through a generated go.mod (-modfile) that replaces it with the copy. The
  # copy lives in the cache directory, never in the repository.
  vwf_version=$(awk '$1=="github.com/kcp-dev/virtual-workspace-framework"{print $2; exit}' go.mod)
  vwf_src=$(go mod download -json "github.com/kcp-dev/virtual-workspace-framework@${vwf_version}" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  vwf_copy="$out_dir/virtual-workspace-framework"
  rm -rf "$vwf_copy" && cp -r "$vwf_src" "$vwf_copy" && chmod -R u+w "$vwf_copy"
  cp compat/forwardingregistry_compat.go "$vwf_copy/pkg/forwardingregistry/zz_vwserver_compat.go"
  cp go.mod "$out_dir/build.mod" && cp go.sum "$out_dir/build.sum"
  go mod edit -modfile="$out_dir/build.mod" \
    -replace "github.com/kcp-dev/virtual-workspace-framework=$vwf_copy"
  for t in "${missing[@]}"; do
    start=$(date +%s)
    pkg="github.com/kcp-dev/kcp/cmd/$t"
    # Download only the modules this command needs (some of kcp's tool dependencies are not
    # served), then compile with -v (one line per package).
    go list -modfile="$out_dir/build.mod" -deps "$pkg" >/dev/null
    tmp="$out_dir/$t.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    # pipefail makes the pipeline fail when go build does; awk only thins out the progress lines.
    if ! go build -modfile="$out_dir/build.mod" -v -trimpath -ldflags="-s -w" -o "$tmp" "$pkg" 2>&1 \
      | awk '/[: ]/ {print; fflush(); next}  # compiler errors pass through whole
             {n++; if (n % 50 == 0) {printf "  compiled %d packages (latest: %s)\n", n, $0; fflush()}}' >&2
    then
      echo "kcp $t build failed (see the errors above)" >&2
      exit 1
    fi
    mv "$tmp" "$out_dir/$t"
    echo "kcp ${version}: built $t in $(( $(date +%s) - start ))s -> $out_dir/$t" >&2
  done
fi

for t in "${targets[@]}"; do
  echo "$out_dir/$t"
done
