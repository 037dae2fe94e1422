//go:build tools

// Package tools pins the kcp server so that `go build github.com/kcp-dev/kcp/cmd/kcp`
// resolves through this module's go.mod (and its replace block) rather than kcp's own.
package tools

import _ "github.com/kcp-dev/kcp/cmd/kcp"
