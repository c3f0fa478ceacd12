// Package agent is the drover-agent daemon: enrollment, certificate
// renewal, the manifest sync loop, the telemetry stream with its durable
// outbox, the spool collector and the local control socket. Only
// agent/cli (the drover-agent command) and tests import it; the parts it
// drives live in agent/apply (systemd and cron backends), agent/runner (the
// per-run process), agent/spool and agent/store (bbolt).
//
// # Life of the daemon
//
//  1. Enrollment (enroll.go, daemon.go): without an identity, the daemon
//     waits for a token (the token file, watched every second; the
//     DROVER_ENROLL_TOKEN value; or `drover-agent enroll --token` over the
//     control socket), checks the server's CA against the token's pin
//     before sending anything, enrolls and deletes the token file. Bad
//     tokens are retried with backoff.
//  2. The stored manifest is applied at once (applyStored), so the host
//     matches it before the server answers.
//  3. Concurrently: renewLoop (renew.go) renews the certificate at two
//     thirds of its lifetime; streamLoop (stream.go) keeps the gRPC stream
//     up, sending the outbox in order and deleting a record only on the
//     server's Ack, and carries out SyncNow, RunNow (runnow.go) and
//     CancelRun; collectLoop (collect.go) moves runner records from the
//     spools into the outbox; reenrollLoop (reenroll.go) watches for an
//     identity the server no longer accepts; syncLoop (sync.go) takes the
//     manifest a SyncNow carried or else pulls it, verifies it either way
//     on one path (signing.AcceptManifest, before anything is parsed),
//     fetches payloads by digest and secrets, and applies.
//
// # Guarantees
//
//   - A rejected manifest changes nothing on the host and is reported.
//   - Every run is reported exactly once, in order, whatever happens to the
//     daemon, the network or the server: runners spool durably, the outbox
//     drains only on acknowledgement, and spool records are enqueued once.
//   - Every RunNow the server sent ends in a run record: the run, or one
//     the agent writes (skipped: a run is in progress; failed: it could not
//     start one, after syncing once in case the pipe is new).
//   - The agent knows every replica of the server and talks to one at a
//     time, staying with it while it works and moving to the next within
//     seconds when it fails, for its polls and its stream (replicas.go).
//   - An identity that stops working (revoked, expired, another server CA)
//     leaves the pipes running; a new token re-enrolls the host as a new
//     agent, and the old id's manifest serials no longer judge the new
//     id's.
package agent
