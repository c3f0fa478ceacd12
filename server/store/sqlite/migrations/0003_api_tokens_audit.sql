-- Operator API tokens with roles, the audit log, and an index for run
-- counts by status (the drover_runs metric).

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL,
    secret_hash  BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    created_by   TEXT NOT NULL DEFAULT '',
    expires_at   INTEGER NOT NULL DEFAULT 0,
    last_used_at INTEGER NOT NULL DEFAULT 0,
    revoked_at   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX api_tokens_created ON api_tokens(created_at, id);

CREATE TABLE audit_log (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            INTEGER NOT NULL,
    actor_id      TEXT NOT NULL,
    actor_name    TEXT NOT NULL,
    role          TEXT NOT NULL,
    action        TEXT NOT NULL,
    target        TEXT NOT NULL,
    before_digest TEXT NOT NULL DEFAULT '',
    after_digest  TEXT NOT NULL DEFAULT '',
    source        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_at ON audit_log(at);
CREATE INDEX audit_target ON audit_log(target, id);
CREATE INDEX audit_action ON audit_log(action, id);

CREATE INDEX runs_status ON runs(status);
CREATE INDEX runs_request ON runs(request_id) WHERE request_id <> '';
