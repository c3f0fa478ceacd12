// Command boottest-rootfs builds the cached Debian root of the booted tests
// (package boottest) when it is missing, so that a CI machine can warm it
// before `go test` runs: `go run ./packaging/boottest/cmd/boottest-rootfs`.
// It prints where the root is and how long building it took.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/drover/drover/packaging/boottest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := boottest.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "boottest-rootfs: cannot boot containers here:", err)
		os.Exit(1)
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	lock, st, err := boottest.EnsureRootfs(ctx, logf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "boottest-rootfs:", err)
		os.Exit(1)
	}
	lock.Close()
	if st.Built {
		fmt.Printf("%s built in %s from %s\n", boottest.RootfsPath(), st.Duration.Round(1e8), st.Mirror)
	} else {
		fmt.Printf("%s is there already\n", boottest.RootfsPath())
	}
}
