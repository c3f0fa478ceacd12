// Package server is drover-server, the Drover control plane: its
// configuration, the wiring of its parts (New, NewWithStore), Run, the
// maintenance and missed-run loops, metrics, the HTTPS API handlers
// (http_*.go, one file per resource) and the command line (Main). Its
// parts live in subpackages: errs (error kinds and codes), store (domain
// types and store interfaces) with store/sqlite and store/storetest, pki
// (CA, keyring, sealer, admin token) and stream (the gRPC telemetry
// stream). cmd/drover-server is a thin shim over Main. Other packages
// should not import it, except tests of the agent and droverctl that start a
// real server in process (New, Run, HTTPAddr, GRPCAddr, ReadAdminToken).
//
// # Starting
//
// New(cfg, logger, clock) prepares the data dir, opens the store, compiles
// manifests and binds both listeners (so tests can use 127.0.0.1:0 and read
// HTTPAddr and GRPCAddr back); Run(ctx) serves until ctx is cancelled and
// then drains. Configuration is DefaultConfig, overlaid by the YAML file
// (unknown fields refused), then by DROVER_<YAML_PATH> environment variables
// (DROVER_DATA_DIR, DROVER_HTTP_ADDR, DROVER_GRPC_ADDR, DROVER_PUBLIC_URL,
// DROVER_GRPC_PUBLIC_ADDR, DROVER_TLS_SANS=a,b, DROVER_RUNS_MAX_LOG_BYTES,
// DROVER_METRICS_PUBLIC=true, ...), then by the command-line flags.
//
// # Data dir (default /var/lib/drover-server; mode 0700, files 0600 except ca.crt)
//
//	ca.key, ca.crt        the CA (ECDSA P-256, 10 years); ca.crt is 0644, for clients
//	tls.key, tls.crt      the server certificate for both listeners, issued by the CA,
//	                      SANs: localhost, 127.0.0.1, ::1, the hostname, the hosts of
//	                      public_url(s) and grpc_public_addr(s), tls_sans; re-issued at start
//	                      when a SAN is missing or less than 30 days are left
//	root.key              the root signing key (PKCS#8 PEM); agents pin its public half
//	manifest-<keyid>.key  manifest signing keys named by the key list (at most the
//	                      active one and its predecessor)
//	keylist.dsse          the root-signed key list (DSSE, keylist payload type)
//	secrets.key           the AES-256-GCM key for secret values (hex)
//	admin.token           the bootstrap admin API token (hex), valid until revoked
//	server.db             SQLite in WAL mode (+ -wal, -shm): every other piece of state
//	server.lock           flock held by the running server
//
// With store.driver postgres (docs/postgres.md) the CA key and certificate,
// root.key, the manifest keys, keylist.dsse, secrets.key and the admin
// token live in the database instead (table server_keys), each sealed with
// AES-256-GCM under the key-encryption key of kek_file, and every replica
// loads the same ones; the data dir keeps this replica's tls.key/tls.crt
// and copies of ca.crt and admin.token for the tools on the host.
//
// Payload bundles live in server.db, content-addressed by sha256 (table
// payloads), not as files: a pipe version and its bundle commit in one
// transaction, so a crash can never leave a version without its bundle or an
// orphan file; backups and restores are one file; bundles are capped at
// 10 MiB and fetched only when a digest changes, so serving them from SQLite
// costs little. A PostgreSQL store can keep them as bytea or move them to
// object storage behind the same store.PipeStore interface.
//
// # HTTP API (HTTPS on :8443)
//
// Every error is JSON with the status of its kind (package errs holds the one
// table from kinds to HTTP and gRPC codes):
//
//	{"error": {"code": "validation_failed", "message": "...",
//	           "details": [{"field": "spec.schedule", "message": "...", "line": 0}]}}
//
// Codes: invalid_request 400, validation_failed 422, unauthenticated 401,
// certificate_refused 401, invalid_token 401, token_expired 401, token_used
// 401, token_revoked 401, agent_revoked 403, permission_denied 403, not_found 404,
// method_not_allowed 405, conflict 409, too_large 413,
// unsupported_media_type 415, rate_limited 429, unavailable 503, internal
// 500. Request bodies are JSON (Content-Type application/json or none),
// size-limited (http.max_body_bytes, 1 MiB; pipe uploads 1 MiB plus the
// base64 of a maximal bundle) and decoded strictly: unknown fields and
// trailing data are refused.
//
// Enrollment (TLS, no client certificate; rate-limited per source address):
//
//	POST /api/v1/agents/enroll
//	  {"token","hostname","os","arch","agent_version","csr","machine_id"?}
//	  machine_id (optional, 32 hex digits: /etc/machine-id) binds the identity to the
//	  host at once; without it the first Hello that carries one binds it.
//	  token: drv1.<id>.<secret>.<ca-pin>, ca-pin = lowercase hex sha256 of the CA
//	  certificate's SubjectPublicKeyInfo DER (the server's TLS chain carries the CA
//	  so the agent can check the pin before sending anything). csr: PEM
//	  "CERTIFICATE REQUEST", ECDSA P-256; its subject and SANs are ignored.
//	  200 {"agent_id","certificate","ca_bundle","trust_root":{"root_keys","key_list"},
//	       "grpc_addr":"host:port","cert_expires_at","server_urls"?,"grpc_addrs"?}
//	  server_urls and grpc_addrs list every replica (public_url(s),
//	  grpc_public_addr(s)); grpc_addr is their first stream address. Renewal answers
//	  carry the same lists, and so does every manifest answer, in the headers
//	  X-Drover-Server-Urls and X-Drover-Grpc-Addrs (comma-separated).
//	  The certificate names the agent in its CommonName and in a URI SAN
//	  drover://agent/<id>, with EKU clientAuth, for enrollment.cert_lifetime (30 days).
//
// Agent endpoints (mTLS with a certificate from this CA; the agent is the one
// the certificate names; a certificate whose serial is neither the agent's
// current nor its next one, or of a revoked or unknown agent, is refused with
// 401 certificate_refused or 403 agent_revoked; the first use of the next
// certificate makes it current and retires the old one):
//
//	POST /api/v1/agents/self/renew        {"csr"} (a new key) -> {"certificate","ca_bundle","cert_expires_at"}
//	GET  /api/v1/agents/self/manifest     the signed DSSE envelope bytes, exactly as stored
//	     Content-Type: application/vnd.drover.manifest.v1.dsse+json
//	     ETag: "sha256:<hex of the envelope bytes>"; If-None-Match -> 304
//	     X-Drover-Manifest-Serial: <serial>
//	GET  /api/v1/agents/self/trust        signing.TrustRoot {"root_keys","key_list"}: fetch it
//	     when a manifest is signed by an unknown key or names a newer key list
//	GET  /api/v1/agents/self/payloads/{digest}   digest "sha256:<hex>" named by the agent's
//	     current manifest, else 404; Content-Type application/vnd.drover.bundle.v1+gzip
//	GET  /api/v1/agents/self/secrets      {"secrets":{"NAME":"value"}} for the names the
//	     pipes of its current manifest reference (Cache-Control: no-store)
//
// An agent request carrying X-Drover-Machine-Id that names another machine
// than the one bound to the identity is refused with 409 identity_conflict.
// Payloads are streamed from the store in slices; at most
// agents.payload_fetches_per_agent (2) per agent and agents.payload_fetches
// (32) in all run at once, beyond which the answer is 429 with Retry-After.
// A slow download holds one 256 KiB slice, not the payload (each slice is
// read with substr, which SQLite computes from the whole value only for the
// query's duration; the read pool runs at most 4 queries at once).
//
// # Operator API (Authorization: Bearer <API token>)
//
// openapi.json (served at GET /api/v1/openapi.json, no authentication) is
// the reference: every route with its parameters, bodies, answers, least
// role (x-drover-role) and audit action (x-drover-audit-action). It is
// generated from the route table in http_routes.go, which is also what the
// router, the role check, the audit log and the role-matrix test read;
// TestOpenAPI fails when the file is stale (regenerate it with
// DROVER_UPDATE_OPENAPI=1 go test -run TestOpenAPI ./server).
//
// Tokens and roles (auth.go). API tokens are "drvt1.<id>.<secret>", created
// by POST /api/v1/api-tokens {"name","role","ttl"?} (the answer is the only
// place the token appears) or on the host by `drover-server api-tokens
// create`; only sha256(secret) is stored. Roles: viewer reads (pipes,
// agents, runs and logs, secret names, the audit log, metrics); operator
// also applies, deletes and restores pipes, runs and cancels, sets and
// deletes secrets; admin also manages API tokens, enrollment tokens and
// agents (tags, revocation, deletion) and rotates the manifest key. The
// bootstrap admin.token is the token with id "bootstrap": it is listed and
// works until revoked (DELETE /api/v1/api-tokens/bootstrap; it stays
// revoked across restarts). A missing or unknown token is 401
// unauthenticated, an expired one 401 token_expired, a revoked one 401
// token_revoked, a weaker role 403 permission_denied; none of them changes
// anything.
//
// Audit (http_audit.go). Every successful call of a route with an action writes
// one entry before the answer is sent: actor (token id and name; an agent
// id for renewals; "enrollment-token/<id>" for enrollments; "local" for
// the command line), action, target ("pipe/<name>", "agent/<id>",
// "secret/<NAME>", "api-token/<id>", "enrollment-token/<id>", "run/<id>",
// "keys"), time, client address, and the sha256 of the object's API JSON
// before and after ("" for none; a secret's object is its name and times,
// never its value). GET /api/v1/audit?actor=&action=&target=&since=&until=
// lists them newest first. Refused requests (401, 403, refused enrollments
// and renewals) are audited too, as "refused.<code>", rate-limited per
// source and in all (http_audit.go).
//
// Conventions. Lists take ?limit= (1-1000, default 100) and ?cursor= and
// answer {"<items>": [...], "next_cursor": "..."} (no next_cursor on the
// last page). A 200 to a GET carries ETag "sha256:<hex of the body>";
// If-None-Match answers 304. Path names are checked before any lookup
// (a pipe name with "/", "%", a newline ... is a 400 naming it). PUT
// /api/v1/pipes/{name} also takes one YAML spec document with
// Content-Type application/yaml (errors then carry YAML lines). Dry-run
// (POST .../dry-run, {"spec","bundle"} or {"delete": true}) stores nothing
// and lists, per agent, whether the pipe would be added to, updated in or
// removed from its manifest, with the changed entry fields. Live logs: GET
// /api/v1/runs/{id}/logs/stream is text/event-stream ("chunk" events with
// id = chunk seq, one "end" event with the run; Last-Event-ID resumes; see
// http_logstream.go). /metrics is Prometheus text (metrics.go): viewer role, or no
// authentication with metrics_public: true.
//
// Routes (least role; audit action):
//
//	GET    /healthz                                         public
//	GET    /metrics                                         viewer (public with metrics_public)
//	GET    /api/v1/openapi.json                             public
//	POST   /api/v1/agents/enroll                            public (enrollment token); agents.enroll
//	POST   /api/v1/agents/self/renew                        agent; agents.renew
//	GET    /api/v1/agents/self/{manifest,trust,secrets}     agent
//	GET    /api/v1/agents/self/payloads/{digest}            agent
//	GET    /api/v1/whoami                                   viewer
//	GET    /api/v1/version                                  viewer
//	GET    /api/v1/pipes?tag=k=v&agent=                     viewer
//	GET    /api/v1/pipes/{name}                             viewer
//	PUT    /api/v1/pipes/{name}                             operator; pipes.write
//	DELETE /api/v1/pipes/{name}                             operator; pipes.delete
//	GET    /api/v1/pipes/{name}/versions                    viewer
//	GET    /api/v1/pipes/{name}/versions/{version}          viewer
//	POST   /api/v1/pipes/{name}/versions/{version}/restore  operator; pipes.restore
//	GET    /api/v1/pipes/{name}/schedule?count=&after=      viewer
//	GET    /api/v1/pipes/{name}/fires?since=&until=&limit=  viewer (per fire time: expected, runs per status)
//	POST   /api/v1/pipes/{name}/dry-run                     viewer (stores nothing)
//	POST   /api/v1/pipes/{name}/run {agent | tags}          operator; pipes.run
//	POST   /api/v1/pipes/{name}/move {to}                   operator; pipes.move
//	GET    /api/v1/agents?tag=k=v&status=online|offline|revoked  viewer
//	GET    /api/v1/agents/{id}                              viewer
//	PUT    /api/v1/agents/{id}/tags                         admin; agents.tags
//	POST   /api/v1/agents/{id}/revoke                       admin; agents.revoke
//	DELETE /api/v1/agents/{id}                              admin; agents.delete
//	GET    /api/v1/enrollment-tokens                        admin
//	POST   /api/v1/enrollment-tokens                        admin; enrollment_tokens.create
//	DELETE /api/v1/enrollment-tokens/{id}                   admin; enrollment_tokens.delete
//	GET    /api/v1/api-tokens                               admin
//	POST   /api/v1/api-tokens                               admin; api_tokens.create
//	DELETE /api/v1/api-tokens/{id}                          admin; api_tokens.revoke
//	GET    /api/v1/runs?pipe=&agent=&status=&request_id=&since=&until=  viewer
//	GET    /api/v1/runs/{id}                                viewer
//	GET    /api/v1/runs/{id}/logs                           viewer (text/plain, or JSON chunks)
//	GET    /api/v1/runs/{id}/logs/stream                    viewer (Server-Sent Events)
//	POST   /api/v1/runs/{id}/cancel                         operator; runs.cancel
//	GET    /api/v1/secrets                                  viewer
//	PUT    /api/v1/secrets/{name}                           operator; secrets.write
//	DELETE /api/v1/secrets/{name}                           operator; secrets.delete
//	GET    /api/v1/audit?actor=&action=&target=&since=&until=  viewer
//	GET    /api/v1/events?kind=&pipe=&agent=&since=         viewer
//	POST   /api/v1/keys/rotate                              admin; keys.rotate
//
// Setting or deleting a secret re-publishes the manifests that reference
// it, with a higher serial, so that their agents apply again and fetch the
// value. Run-now sends RunNow with one request_id to every selected agent
// with a live stream ("sent"; the others are "offline"); the runs they
// start carry it. Each agent that got it reports one run for it: the run,
// or one it records itself — skipped when a run of the pipe is in progress,
// failed with the reason when it cannot start one (an agent that does not
// have the pipe yet syncs first). Cancel sends CancelRun to the agent that reported the
// run (409 when the run is over or that agent is not connected).
//
// # Manifests
//
// A pipe reaches an agent when the agent's id is in targets.agents or the
// agent carries every tag of targets.tags (a pipe without targets runs
// nowhere). Disabled pipes stay in the manifest with "enabled": false.
// Whenever a pipe, an agent's tags, enrollment or the key list changes, the
// affected manifests are recompiled; the serial rises only when the content
// (pipes, key-list version) changed, to re-sign a manifest at half its
// lifetime, or when a secret its pipes reference changed. The exact signed bytes are stored and served, and the agent's
// stream gets SyncNow, carrying those bytes when they are at most
// agentpb.MaxSyncNowManifestBytes (the agent then needs no GET). Key rotation lists the new key first and keeps the
// previous one listed until the next rotation.
//
// # Telemetry stream (gRPC on :8444, mTLS, same CA and certificate checks)
//
// The agent is identified by its certificate, never by a message field. The
// first message must be Hello. Durable records (ManifestStatus, RunStarted,
// LogChunk, RunFinished) must carry strictly increasing seqs on a stream
// (Hello and Heartbeat carry 0). Records from all streams are committed in
// batched transactions; Ack(seq) is sent only after the commit and is
// cumulative for the stream. Runs are upserted by run id (a RunFinished
// before its RunStarted works; a run belongs to the agent that reported it
// first), log chunks by (run id, chunk seq); a replay never duplicates. A
// malformed record (say, an empty run id) is acknowledged but not stored, so
// it is not resent forever.
//
// Identity: the Hello must come within agents.hello_timeout (10 s) and carry
// the machine id bound to the identity (at enrollment, or bound now by this
// first Hello); another machine is refused with PERMISSION_DENIED
// "identity_conflict: ..." — counted, audited, shown on the agent — and the
// live stream stays. A stream that passes replaces the agent's live one
// (one per identity; the old one ends with UNAVAILABLE after acknowledging
// what it committed). At most agents.pending_streams (4) streams of one
// identity may be waiting for their Hello. When a renewal's certificate is
// first used, a stream opened with the retired one is closed
// (UNAUTHENTICATED), as revocation closes streams (PERMISSION_DENIED).
//
// Validation (toRecord): run ids are 1-128 of [A-Za-z0-9._:-]; RunStarted and
// RunFinished must name a pipe of the agent's current or previous manifest;
// ManifestStatus keeps only such pipes (at most 10,000 listed) with
// bounded errors; a Heartbeat lists at most agents.max_running_ids (4096)
// ids. Failing records are acknowledged and dropped, counted in
// drover_agent_records_refused_total{reason="invalid|unknown_pipe|too_large"}
// and audited (agent.record_refused) at most once a minute per agent and
// reason. Text fields are bounded and every control character, ANSI escape
// or bidi override in them is stored as a visible \xNN or \uNNNN escape;
// signals other than SIGNAME are stored as "invalid". The Hello's hostname
// is stored as reported_hostname; the hostname checked at enrollment stays.
//
// Quotas (agents.*): run records per agent and per pipe, and log bytes per
// agent, are token buckets. A record over quota waits for its token before
// it is stored (the stream backs up; nothing is dropped, so a long outbox
// replay after an outage still lands whole), counted in
// drover_agent_records_throttled_total{reason}.
//
// Lost runs: a Heartbeat with outbox_records 0 says every record the agent
// had is acknowledged, hence committed (records are committed in order, the
// heartbeat after the records before it). Then each run of that agent still
// pending or running on the server, not in running_run_ids, and started
// before the heartbeat's sent_at (its created_at before the heartbeat's
// arrival when it never reported a start) gets a strike; one it lists has
// its strikes cleared; at two strikes in a row it is settled: failed, reason
// "lost", written_by "server" (two, so that one heartbeat built while the
// agent could not read its scheduler settles nothing). A later RunFinished
// replaces it. Only the live stream settles.
//
// Singletons (leader.go): re-signing and key-list refresh, retention,
// missed-run detection and notification delivery run where the leader seam
// says: always on a server alone (soleLeader), on the replica whose
// session holds a PostgreSQL advisory lock otherwise (lockLeader: a taker
// waits a 5 s grace; a holder whose session stops answering stops them
// within 3 s).
//
// Missed runs (missed.go): a detection pass every 30 s, run by a leader
// (one server alone always leads), expects of every agent holding an
// enabled pipe a run for each fire time (its reported next fire times
// while online, the evaluator's otherwise) by fire + jitter + grace, and
// stores a run with status missed, reason "not reported" or "agent
// offline", under an id derived from agent, pipe and fire time. A
// RunStarted or RunFinished whose scheduled_at names that fire time deletes
// it in the ingest transaction. Events (events.go) are stored per
// occurrence, deduplicated by a key, and the states behind run.recovered,
// agent.offline/online and manifest.rejected/expired are kept in
// monitor_state so each is announced once per change. A placement: one
// pipe is expected of the agent that held it at each fire time only; one
// that fell while nobody held it is stored as missed with reason "no
// holder" and agent "", deleted by any agent's record of that fire time.
//
// Placement: one (placement.go, docs/placement.md): pipe_holders keeps,
// per pipe, its holder, lease_until, since, the last fire time served when
// it gained it, the holder before with its lease (the fence of a
// hand-over) and a requested move. The compiler plans it over the whole
// fleet at every compilation (compile.Place) and stores it before the
// manifests that carry it; the leases loop, run by the leader every
// placement.lease/10 (1-30 s) and woken when an agent that lost a pipe
// reports its manifest status, renews leases and hands pipes over when due.
//
// A run's log is capped (runs.max_log_bytes,
// 1 MiB): the first chunk over the cap is stored as a truncation marker and
// later ones are dropped. Retention prunes runs older than
// runs.retention_age and beyond runs.retention_per_pipe per pipe. On
// SIGTERM the server stops taking records, commits and acknowledges what it
// received, and ends the streams with UNAVAILABLE.
package server
