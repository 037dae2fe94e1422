//go:build tools

// Package tools pins the commands this module builds (scripts/tools/kube/build.sh); it is never
// compiled.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
