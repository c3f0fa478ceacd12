-- Drover server schema, version 1 (PostgreSQL). Times are Unix nanoseconds
-- (UTC); 0 or NULL means unset. JSON columns hold compact JSON. Text is
-- COLLATE "C" so that order and cursors compare bytes as in SQLite; flags
-- are BOOLEAN.

CREATE TABLE enrollment_tokens (
    id          TEXT COLLATE "C" PRIMARY KEY,
    secret_hash BYTEA NOT NULL,
    name        TEXT COLLATE "C" NOT NULL DEFAULT '',
    tags        TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT NOT NULL DEFAULT 0,
    agent_id    TEXT COLLATE "C" NOT NULL DEFAULT ''
);

CREATE TABLE agents (
    id               TEXT COLLATE "C" PRIMARY KEY,
    name             TEXT COLLATE "C" NOT NULL DEFAULT '',
    hostname         TEXT COLLATE "C" NOT NULL DEFAULT '',
    os               TEXT COLLATE "C" NOT NULL DEFAULT '',
    arch             TEXT COLLATE "C" NOT NULL DEFAULT '',
    agent_version    TEXT COLLATE "C" NOT NULL DEFAULT '',
    tags             TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    cert_serial      TEXT COLLATE "C" NOT NULL,
    next_cert_serial TEXT COLLATE "C" NOT NULL DEFAULT '',
    cert_expires_at  BIGINT NOT NULL DEFAULT 0,
    next_cert_expires_at BIGINT NOT NULL DEFAULT 0,
    revoked_at       BIGINT NOT NULL DEFAULT 0,
    last_seen_at     BIGINT NOT NULL DEFAULT 0,
    backend          TEXT COLLATE "C" NOT NULL DEFAULT '',
    scope            TEXT COLLATE "C" NOT NULL DEFAULT '',
    systemd_version  TEXT COLLATE "C" NOT NULL DEFAULT '',
    accepted_serial  BIGINT NOT NULL DEFAULT 0,
    accepted_digest  TEXT COLLATE "C" NOT NULL DEFAULT '',
    applied_serial   BIGINT NOT NULL DEFAULT 0,
    manifest_state   TEXT COLLATE "C" NOT NULL DEFAULT '',
    manifest_error   TEXT COLLATE "C" NOT NULL DEFAULT '',
    pipe_status      TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    status_seq       BIGINT NOT NULL DEFAULT 0,
    status_at        BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE payloads (
    digest     TEXT COLLATE "C" PRIMARY KEY,
    size       BIGINT NOT NULL,
    data       BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE pipes (
    name            TEXT COLLATE "C" PRIMARY KEY,
    current_version BIGINT NOT NULL,
    deleted_at      BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

CREATE TABLE pipe_versions (
    name           TEXT COLLATE "C" NOT NULL,
    version        BIGINT NOT NULL,
    spec           TEXT COLLATE "C" NOT NULL,
    payload_digest TEXT COLLATE "C" NOT NULL REFERENCES payloads(digest),
    payload_size   BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE manifests (
    agent_id         TEXT COLLATE "C" PRIMARY KEY,
    serial           BIGINT NOT NULL,
    content_hash     TEXT COLLATE "C" NOT NULL,
    digest           TEXT COLLATE "C" NOT NULL,
    envelope         BYTEA NOT NULL,
    issued_at        BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    key_list_version BIGINT NOT NULL,
    payloads         TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    secrets          TEXT COLLATE "C" NOT NULL DEFAULT '[]'
);
CREATE INDEX manifests_issued ON manifests(issued_at);

CREATE TABLE secrets (
    name       TEXT COLLATE "C" PRIMARY KEY,
    sealed     BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE runs (
    id            TEXT COLLATE "C" PRIMARY KEY,
    agent_id      TEXT COLLATE "C" NOT NULL,
    pipe          TEXT COLLATE "C" NOT NULL DEFAULT '',
    pipe_version  BIGINT NOT NULL DEFAULT 0,
    trigger       TEXT COLLATE "C" NOT NULL DEFAULT '',
    status        TEXT COLLATE "C" NOT NULL,
    exit_code     BIGINT NOT NULL DEFAULT 0,
    signal        TEXT COLLATE "C" NOT NULL DEFAULT '',
    error         TEXT COLLATE "C" NOT NULL DEFAULT '',
    request_id    TEXT COLLATE "C" NOT NULL DEFAULT '',
    scheduled_at  BIGINT NOT NULL DEFAULT 0,
    started_at    BIGINT NOT NULL DEFAULT 0,
    finished_at   BIGINT NOT NULL DEFAULT 0,
    duration_ms   BIGINT NOT NULL DEFAULT 0,
    log_chunks    BIGINT NOT NULL DEFAULT 0,
    log_bytes     BIGINT NOT NULL DEFAULT 0,
    log_truncated BOOLEAN NOT NULL DEFAULT false,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE INDEX runs_pipe ON runs(pipe, created_at);
CREATE INDEX runs_agent ON runs(agent_id, created_at);
CREATE INDEX runs_created ON runs(created_at);
CREATE INDEX runs_updated ON runs(updated_at);

CREATE TABLE log_chunks (
    run_id TEXT COLLATE "C" NOT NULL,
    seq    BIGINT NOT NULL,
    stream TEXT COLLATE "C" NOT NULL,
    data   BYTEA NOT NULL,
    at     BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
