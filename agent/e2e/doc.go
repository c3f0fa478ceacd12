// Package e2e is the end-to-end proof of the agent: real
// drover-server and drover-agent processes, built once by TestMain, driven
// through their public surfaces only — the admin HTTP API, `drover-server
// tokens create`, the agent's configuration file, control socket and CLI
// (`status --json`, `sync`, `enroll`), systemctl and the files the agent
// writes — on private systemd user managers (agent/internal/sdtest) and,
// for system scope, in a booted Debian container (packaging/boottest).
//
// The package holds tests only (this file gives it a package comment):
//
//   - TestUserManagerEndToEnd: token-file enrollment, pipes created through
//     the API, list-timers against the schedule evaluator, RunNow, Cancel
//     (the process tree is gone), a timeout, a scheduled run with its status
//     and log on the server, schedule edits around the old fire time with
//     no extra run, a hand-edited unit restored and reported, removal of
//     both units.
//   - TestSystemScopeBooted: the same steps in system scope on a booted
//     Debian under the shipped drover-agent.service, plus a dynamic user,
//     the default hardening profile, and a secret delivered through
//     LoadCredential= and masked (***) in the logs the server stores.
//   - TestCronBackendSameFireTimes: the same pipes on a cron-backend agent
//     and a systemd-backend agent have the same next fire times (live and
//     as reported to the server) and fire at the same instant; the cron
//     backend's runs reach the server.
//   - TestRetriesBothBackends: retries on a systemd agent and a cron agent:
//     a script failing twice then succeeding is one run with attempts 3 and
//     every attempt's output and marker line in its log; an always-failing
//     one fails after its third attempt with the waits within 10% of the
//     backoff and one run.failed event; a timed-out attempt is retried; a
//     cancel during a delay ends the run with no further attempt; droverctl
//     shows the attempts.
//   - TestPlacementOneAcrossFaults: a placement: one every-minute pipe on
//     three cron agents and a systemd one for about 10 minutes: a
//     droverctl move, a SIGSTOPped cron holder and systemd agent (another
//     gains the pipe only after the lease plus the skew margin, within the
//     documented bound; the old one never runs it again; the stopped
//     systemd agent's timer is refused after its lease), the server down
//     past the lease (the holder runs inside it, stops, catches up); no
//     fire time runs twice, and one goes unrun only while no holder is
//     live.
//   - TestOfflineRunsArriveExactlyOnce: the server process is stopped while
//     105 runs happen; after its restart every run and every log chunk
//     arrives exactly once and in order.
//   - TestFailoverReplicaKilled, TestFailoverReplicaBlackholed: replicas
//     of drover-server on one PostgreSQL (pgtest; they share keys through
//     the store, sealed by one KEK file); an agent's stream and polls move
//     to another replica within 10 s of a SIGKILL or a blackhole, a run in
//     flight arrives exactly once, the agent stays where it moved.
//   - TestSoakReplicas: three replicas on one PostgreSQL, six cron-backend
//     agents spread over them with an every-minute pipe, a pipe changed
//     every 7 s; a run-now burst, then SIGKILL of the replica with the
//     most streams (every agent on another replica within 10 s), then
//     PostgreSQL stopped over a minute's fire and started again. Every
//     fire time and every run-now has exactly one run, no serial went
//     backwards, and the leadership terms in the replicas' logs never
//     overlap. 150 s of fleet time by default; DROVER_SOAK=10m (with
//     -timeout 20m) for ten minutes.
//   - TestCrashDuringSyncAndApply: 50 SIGKILLs of the agent at random points
//     of sync and apply; after each restart the units on disk equal the
//     manifest and no temporary file remains.
//   - TestTamperingProxy: a fault-injecting TLS proxy between agent and
//     server flips manifest bytes, replays an older manifest, serves another
//     agent's manifest and a payload whose digest does not match; each is
//     refused and reported, and the installed pipes stay untouched.
//   - BenchmarkAgentIdleRSS100: the agent's resident memory with 100 pipes
//     once it has settled (30 s by default; DROVER_E2E_RSS_SETTLE=10m for
//     the figure the README reports). Applying 1,000 pipes on the user manager is
//     agent/apply's BenchmarkApply1000.
//
// Each test has its own server, agent(s) and user manager, and they all run
// at once (TestMain raises -parallel unless it is given). DROVER_TEST_LOG=1
// streams the processes' logs; a failing test shows their tails and the
// state of its pipe units.
//
// Nothing imports it.
package e2e
