// Package server is drover-server, the Drover control plane: the HTTPS API
// (enrollment, the agents' mTLS endpoints, the admin API), the gRPC telemetry
// stream, the certificate authority, the manifest compiler and the embedded
// SQLite store. cmd/drover-server is a thin shim over Main. Other packages
// should not import it, except tests of the agent and droverctl that start a
// real server in process (New, Run, HTTPAddr, GRPCAddr, ReadAdminToken) and
// that may reuse its exported request and response types.
//
// # Starting
//
// New(cfg, logger, clock) prepares the data dir, opens the store, compiles
// manifests and binds both listeners (so tests can use 127.0.0.1:0 and read
// HTTPAddr and GRPCAddr back); Run(ctx) serves until ctx is cancelled and
// then drains. Configuration is DefaultConfig, overlaid by the YAML file
// (unknown fields refused), then by DROVER_<YAML_PATH> environment variables
// (DROVER_DATA_DIR, DROVER_HTTP_ADDR, DROVER_GRPC_ADDR, DROVER_PUBLIC_URL,
// DROVER_GRPC_PUBLIC_ADDR, DROVER_TLS_SANS=a,b, DROVER_RUNS_MAX_LOG_BYTES, ...),
// then by the command-line flags.
//
// # Data dir (default /var/lib/drover-server; mode 0700, files 0600 except ca.crt)
//
//	ca.key, ca.crt        the CA (ECDSA P-256, 10 years); ca.crt is 0644, for clients
//	tls.key, tls.crt      the server certificate for both listeners, issued by the CA,
//	                      SANs: localhost, 127.0.0.1, ::1, the hostname, the hosts of
//	                      public_url and grpc_public_addr, tls_sans; re-issued at start
//	                      when a SAN is missing or less than 30 days are left
//	root.key              the root signing key (PKCS#8 PEM); agents pin its public half
//	manifest-<keyid>.key  manifest signing keys named by the key list (at most the
//	                      active one and its predecessor)
//	keylist.dsse          the root-signed key list (DSSE, keylist payload type)
//	secrets.key           the AES-256-GCM key for secret values (hex)
//	admin.token           the admin bearer token (hex); read it to use the admin API
//	server.db             SQLite in WAL mode (+ -wal, -shm): every other piece of state
//	server.lock           flock held by the running server
//
// Payload bundles live in server.db, content-addressed by sha256 (table
// payloads), not as files: a pipe version and its bundle commit in one
// transaction, so a crash can never leave a version without its bundle or an
// orphan file; backups and restores are one file; bundles are capped at
// 10 MiB and fetched only when a digest changes, so serving them from SQLite
// costs little. A PostgreSQL store can keep them as bytea or move them to
// object storage behind the same pipeStore interface.
//
// # HTTP API (HTTPS on :8443)
//
// Every error is JSON with the status of its kind (errors.go holds the one
// table from kinds to HTTP and gRPC codes):
//
//	{"error": {"code": "validation_failed", "message": "...",
//	           "details": [{"field": "spec.schedule", "message": "...", "line": 0}]}}
//
// Codes: invalid_request 400, validation_failed 422, unauthenticated 401,
// certificate_refused 401, invalid_token 401, token_expired 401, token_used
// 401, agent_revoked 403, permission_denied 403, not_found 404,
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
//	  {"token","hostname","os","arch","agent_version","csr"}
//	  token: drv1.<id>.<secret>.<ca-pin>, ca-pin = lowercase hex sha256 of the CA
//	  certificate's SubjectPublicKeyInfo DER (the server's TLS chain carries the CA
//	  so the agent can check the pin before sending anything). csr: PEM
//	  "CERTIFICATE REQUEST", ECDSA P-256; its subject and SANs are ignored.
//	  200 {"agent_id","certificate","ca_bundle","trust_root":{"root_keys","key_list"},
//	       "grpc_addr":"host:port","cert_expires_at"}
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
// Admin endpoints (Authorization: Bearer <admin.token>; authorize(r, action)
// is the seam for roles):
//
//	POST   /api/v1/enrollment-tokens  {"ttl":"1h","name","tags":{}} -> 201 {"id","token","expires_at"}
//	PUT    /api/v1/pipes/{name}       {"spec":<manifest.Spec>,"bundle":"<base64>"} -> 201 created /
//	       200 unchanged {"name","version","digest","created"}; bundle required with command,
//	       refused with script (the script becomes the bundle); every problem is reported at once
//	GET    /api/v1/pipes              {"pipes":[{"name","version","spec","payload","created_at","updated_at"}]}
//	GET    /api/v1/pipes/{name}       the same plus "versions"
//	DELETE /api/v1/pipes/{name}       204
//	POST   /api/v1/pipes/{name}/run   {"agent":id?} -> 202 {"request_id","sent":[ids],"offline":[ids]}
//	GET    /api/v1/agents             {"agents":[...]}; GET /api/v1/agents/{id} adds "manifest"
//	PUT    /api/v1/agents/{id}/tags   {"tags":{}} -> the agent
//	POST   /api/v1/agents/{id}/revoke -> the agent; its live streams close at once
//	GET    /api/v1/runs?pipe=&agent=&status=&limit= (1-1000, default 100) -> {"runs":[...]}
//	GET    /api/v1/runs/{id}          the run
//	GET    /api/v1/runs/{id}/logs     text/plain, chunks in order (a truncated log ends with
//	       the marker; X-Drover-Log-Truncated); with Accept: application/json
//	       {"run_id","truncated","chunks":[{"seq","stream","at","data":<base64>}]}
//	PUT    /api/v1/secrets/{name}     {"value"} -> 204 (values are write-only)
//	GET    /api/v1/secrets            {"secrets":[{"name","created_at","updated_at"}]}
//	       (setting or deleting a secret re-publishes the manifests that reference it,
//	       with a higher serial, so that their agents apply again and fetch the value)
//	DELETE /api/v1/secrets/{name}     204
//	POST   /api/v1/keys/rotate        -> {"key_id","key_list_version"}
//	GET    /healthz                   {"status":"ok"} (no authentication)
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
// stream gets SyncNow. Key rotation lists the new key first and keeps the
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
// it is not resent forever. A run's log is capped (runs.max_log_bytes,
// 1 MiB): the first chunk over the cap is stored as a truncation marker and
// later ones are dropped. Retention prunes runs older than
// runs.retention_age and beyond runs.retention_per_pipe per pipe. On
// SIGTERM the server stops taking records, commits and acknowledges what it
// received, and ends the streams with UNAVAILABLE.
package server
