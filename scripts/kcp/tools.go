//go:build tools

// Package tools pins the kcp commands build.sh builds (the server, and the pieces of a sharded
// kcp) so that `go build github.com/kcp-dev/kcp/cmd/...` resolves through this module's go.mod
// (and its replace block) rather than kcp's own.
package tools

import (
	_ "github.com/kcp-dev/kcp/cmd/cache-server"
	_ "github.com/kcp-dev/kcp/cmd/kcp"
	_ "github.com/kcp-dev/kcp/cmd/kcp-front-proxy"
)
