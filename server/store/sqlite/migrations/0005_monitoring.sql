-- Fleet monitoring: runs found by their fire time, the events the server
-- records about runs, agents and manifests, and the small durable state
-- that keeps those events to one per change of state.

CREATE INDEX runs_agent_pipe_scheduled ON runs(agent_id, pipe, scheduled_at) WHERE scheduled_at <> 0;
CREATE INDEX runs_pipe_scheduled ON runs(pipe, scheduled_at) WHERE scheduled_at <> 0;

CREATE TABLE events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    pipe     TEXT NOT NULL DEFAULT '',
    agent_id TEXT NOT NULL DEFAULT '',
    run_id   TEXT NOT NULL DEFAULT '',
    message  TEXT NOT NULL DEFAULT '',
    -- the same occurrence recorded twice (a replayed record) is one event
    dedupe   TEXT NOT NULL UNIQUE
);
CREATE INDEX events_kind ON events(kind, id);
CREATE INDEX events_pipe ON events(pipe, id) WHERE pipe <> '';
CREATE INDEX events_agent ON events(agent_id, id) WHERE agent_id <> '';
CREATE INDEX events_at ON events(at);

CREATE TABLE monitor_state (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
