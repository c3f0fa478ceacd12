-- Notifications: channels (secrets sealed by the server), rules, the
-- routing progress and states (one notification per change of state), and
-- the durable delivery queue.

CREATE TABLE notify_channels (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    url           TEXT NOT NULL,
    sealed_secret BLOB,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);

CREATE TABLE notify_rules (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL, -- the rule as JSON
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE notify_state (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE notify_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    channel         TEXT NOT NULL,
    event_id        INTEGER NOT NULL DEFAULT 0,
    body            BLOB NOT NULL,
    created_at      INTEGER NOT NULL,
    next_at         INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    state           TEXT NOT NULL DEFAULT 'pending', -- pending, delivered, failed
    last_error      TEXT NOT NULL DEFAULT '',
    last_attempt_at INTEGER NOT NULL DEFAULT 0,
    done_at         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX notify_deliveries_due ON notify_deliveries(next_at) WHERE state = 'pending';
CREATE INDEX notify_deliveries_channel ON notify_deliveries(channel, id);
