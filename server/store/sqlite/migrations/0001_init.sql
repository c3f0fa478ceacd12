-- Drover server schema, version 1. Times are Unix nanoseconds (UTC); 0 or
-- NULL means unset. JSON columns hold compact JSON.

CREATE TABLE enrollment_tokens (
    id          TEXT PRIMARY KEY,
    secret_hash BLOB NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    tags        TEXT NOT NULL DEFAULT '{}',
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER NOT NULL DEFAULT 0,
    agent_id    TEXT NOT NULL DEFAULT ''
);

CREATE TABLE agents (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL DEFAULT '',
    hostname         TEXT NOT NULL DEFAULT '',
    os               TEXT NOT NULL DEFAULT '',
    arch             TEXT NOT NULL DEFAULT '',
    agent_version    TEXT NOT NULL DEFAULT '',
    tags             TEXT NOT NULL DEFAULT '{}',
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    cert_serial      TEXT NOT NULL,
    next_cert_serial TEXT NOT NULL DEFAULT '',
    cert_expires_at  INTEGER NOT NULL DEFAULT 0,
    next_cert_expires_at INTEGER NOT NULL DEFAULT 0,
    revoked_at       INTEGER NOT NULL DEFAULT 0,
    last_seen_at     INTEGER NOT NULL DEFAULT 0,
    backend          TEXT NOT NULL DEFAULT '',
    scope            TEXT NOT NULL DEFAULT '',
    systemd_version  TEXT NOT NULL DEFAULT '',
    accepted_serial  INTEGER NOT NULL DEFAULT 0,
    accepted_digest  TEXT NOT NULL DEFAULT '',
    applied_serial   INTEGER NOT NULL DEFAULT 0,
    manifest_state   TEXT NOT NULL DEFAULT '',
    manifest_error   TEXT NOT NULL DEFAULT '',
    pipe_status      TEXT NOT NULL DEFAULT '[]',
    status_seq       INTEGER NOT NULL DEFAULT 0,
    status_at        INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE payloads (
    digest     TEXT PRIMARY KEY,
    size       INTEGER NOT NULL,
    data       BLOB NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE pipes (
    name            TEXT PRIMARY KEY,
    current_version INTEGER NOT NULL,
    deleted_at      INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

CREATE TABLE pipe_versions (
    name           TEXT NOT NULL,
    version        INTEGER NOT NULL,
    spec           TEXT NOT NULL,
    payload_digest TEXT NOT NULL REFERENCES payloads(digest),
    payload_size   INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (name, version)
) WITHOUT ROWID;

CREATE TABLE manifests (
    agent_id         TEXT PRIMARY KEY,
    serial           INTEGER NOT NULL,
    content_hash     TEXT NOT NULL,
    digest           TEXT NOT NULL,
    envelope         BLOB NOT NULL,
    issued_at        INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    key_list_version INTEGER NOT NULL,
    payloads         TEXT NOT NULL DEFAULT '[]',
    secrets          TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX manifests_issued ON manifests(issued_at);

CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    sealed     BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    pipe          TEXT NOT NULL DEFAULT '',
    pipe_version  INTEGER NOT NULL DEFAULT 0,
    trigger       TEXT NOT NULL DEFAULT '',
    status        TEXT NOT NULL,
    exit_code     INTEGER NOT NULL DEFAULT 0,
    signal        TEXT NOT NULL DEFAULT '',
    error         TEXT NOT NULL DEFAULT '',
    request_id    TEXT NOT NULL DEFAULT '',
    scheduled_at  INTEGER NOT NULL DEFAULT 0,
    started_at    INTEGER NOT NULL DEFAULT 0,
    finished_at   INTEGER NOT NULL DEFAULT 0,
    duration_ms   INTEGER NOT NULL DEFAULT 0,
    log_chunks    INTEGER NOT NULL DEFAULT 0,
    log_bytes     INTEGER NOT NULL DEFAULT 0,
    log_truncated INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX runs_pipe ON runs(pipe, created_at);
CREATE INDEX runs_agent ON runs(agent_id, created_at);
CREATE INDEX runs_created ON runs(created_at);
CREATE INDEX runs_updated ON runs(updated_at);

CREATE TABLE log_chunks (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    stream TEXT NOT NULL,
    data   BLOB NOT NULL,
    at     INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
