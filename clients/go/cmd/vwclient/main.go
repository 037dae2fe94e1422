// Command vwclient runs stock Kubernetes Go clients (client-go, controller-runtime) against a
// vwserver slice URL (or kcp's own APIExport virtual workspace), for vwserver's e2e tests.
//
// Subcommands:
//
//	vwclient informer   a client-go informer on one resource; one JSON line per handler call
//	vwclient reconciler a controller-runtime manager with a finalizer/status reconciler
//
// Everything a test reads goes to stdout as JSON lines (see out.go); logs go to stderr.
// Both subcommands stop cleanly on SIGTERM or SIGINT (exit code 0).
package main

import (
	"fmt"
	"os"
)

const usage = `usage: vwclient <informer|reconciler> [flags]   (vwclient <cmd> -h for flags)`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "informer":
		code = runInformer(os.Args[2:])
	case "reconciler":
		code = runReconciler(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Println(usage)
	default:
		fmt.Fprintf(os.Stderr, "vwclient: unknown command %q\n%s\n", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
