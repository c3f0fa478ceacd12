// Command droverctl is the operator CLI for a Drover control plane.
package main

import (
	"os"

	"github.com/drover/drover/cmd/droverctl/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(cli.Main(version)) }
