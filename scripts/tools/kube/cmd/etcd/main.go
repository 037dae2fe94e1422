// Command etcd is etcd's own server entry point (go.etcd.io/etcd/server/v3/etcdmain), built from
// this module so that it shares kube-apiserver's etcd version: etcd's root module, which holds
// its main package, has replace directives and cannot be built from the module proxy directly.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
