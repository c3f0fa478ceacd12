// Command drover-sim runs simulated agents against a real drover-server and
// reports what the fleet costs it. All of its logic lives in package sim.
package main

import (
	"os"

	"github.com/drover/drover/cmd/drover-sim/sim"
)

func main() {
	os.Exit(sim.Main(os.Args[1:], os.Stdout, os.Stderr))
}
