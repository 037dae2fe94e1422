//go:build tools

// Package tools pins the command this module builds (scripts/tools/build.sh helm); it is never
// compiled.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
