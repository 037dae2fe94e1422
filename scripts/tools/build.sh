#!/usr/bin/env bash
# Build third-party Go commands the tests need from the Go module proxy and cache them outside the
# repository. Each comes from a small wrapper module here that pins it and its whole module graph
# (go.mod, go.sum; -mod=readonly: a build never edits them):
#
#   helm            helm/   helm.sh/helm/v3/cmd/helm (the chart's lint and template tests)
#   kube-apiserver  kube/   k8s.io/kubernetes/cmd/kube-apiserver: a real Kubernetes API server as
#   etcd            kube/   the syncer's downstream cluster (devenv/kubeapi.py), and the etcd it
#                           stores in (go.etcd.io/etcd/server/v3/etcdmain, cmd/etcd here)
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires the k8s.io/* staging modules at
# v0.0.0 and replaces them with ./staging/src/... directories, and replace directives only apply in
# the main module. The wrapper module kube/ requires k8s.io/kubernetes and replaces every staging
# module with its published v0.N.x twin of the same release (v1.37.2 <-> v0.37.2: the Kubernetes
# minor of kcp v0.32.3). etcd's own main package lives in its root module, which has replace
# directives too, hence the three-line cmd/etcd calling etcdmain; in kube/ it shares
# kube-apiserver's etcd version (v3.7.0, from k8s.io/kubernetes' go.mod).
#
#   scripts/tools/build.sh NAME...   build (or reuse) each command and print its path on stdout
#
# Cache: <cache root>/tools/<module>-<key>/NAME, the key hashing the Go version, the link flags
# (versions stamped into the binary) and the module's go.mod, go.sum and .go files
# (scripts/lib/cache.sh). Two builds at once are safe: each writes its own temporary file and
# renames it into place. Progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"

export CGO_ENABLED=0
export GOFLAGS=-mod=readonly

if [[ $# -eq 0 ]]; then
  echo "usage: $0 helm|kube-apiserver|etcd..." >&2
  exit 2
fi

# The version of module $2 that wrapper module $1 requires.
module_version() {
  (cd "$here/$1" && go list -m -f '{{.Version}}' "$2")
}

for name in "$@"; do
  case "$name" in
    helm)
      module=helm pkg=helm.sh/helm/v3/cmd/helm
      # As helm's own Makefile stamps it: its version, and the Kubernetes version that `helm
      # template` and `helm lint` assume (client-go's v0.N is Kubernetes 1.N; unset, 1.20).
      k8s=$(module_version helm k8s.io/client-go)
      k8s_minor=${k8s#v0.}
      k8s_minor=${k8s_minor%%.*}
      ldflags="-X helm.sh/helm/v3/internal/version.version=$(module_version helm helm.sh/helm/v3)"
      for pkg_var in pkg/lint/rules pkg/chartutil; do
        ldflags+=" -X helm.sh/helm/v3/$pkg_var.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg_var.k8sVersionMinor=$k8s_minor"
      done
      ;;
    kube-apiserver)
      module=kube pkg=k8s.io/kubernetes/cmd/kube-apiserver
      # The version the server reports (/version; kubectl's skew warning reads it); unset, it is
      # v0.0.0-master.
      v=$(module_version kube k8s.io/kubernetes)
      minor=${v#v1.}
      minor=${minor%%.*}
      ldflags="-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1"
      ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
      ;;
    etcd)
      module=kube pkg=./cmd/etcd ldflags=""
      ;;
    *)
      echo "build.sh: unknown command '$name'" >&2
      exit 2
      ;;
  esac
  (
    cd "$here/$module"
    mapfile -t sources < <(find . -name '*.go' | LC_ALL=C sort)
    key=$({ go env GOVERSION; echo "$ldflags"; printf '%s\n' "${sources[@]}"; cat go.mod go.sum "${sources[@]}"; } | vw_hash)
    vw_go_build_cached tools "$(vw_cache_root)/tools/$module-$key/$name" "$pkg" "$ldflags"
  )
done
