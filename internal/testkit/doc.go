// Package testkit holds the helpers the repository's tests share: waiting
// for a state with a deadline, skipping for a missing prerequisite (failing
// instead when CI=true), short temporary directories, a free port, a test
// logger, a goroutine-safe buffer, a controllable clock, running a daemon
// until the test stops it (Go), a client for the server's API (APIClient),
// and building the repository's commands once per test binary.
//
// Only tests import it: any package's _test.go files, and the packages that
// exist for tests (agent/internal/sdtest, packaging/boottest,
// server/servertest). It imports
// nothing of this module, so no package's internal tests form a cycle
// through it.
package testkit
