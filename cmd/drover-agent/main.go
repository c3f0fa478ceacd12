// Command drover-agent is Drover's per-host agent.
package main

import (
	"os"

	"github.com/drover/drover/agent/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(cli.Main(version)) }
