// Command drover-server is the Drover control plane. All of its logic,
// including the command line, lives in package server.
package main

import (
	"os"

	"github.com/drover/drover/server"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(server.Main(version, os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}
