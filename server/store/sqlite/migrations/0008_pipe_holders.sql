-- Placement: one. The holder of each such pipe, its lease, and while a
-- hand-over waits for it, the lease of the holder before (the fence);
-- times are Unix nanoseconds, 0 for none.

CREATE TABLE pipe_holders (
    pipe              TEXT PRIMARY KEY,
    agent_id          TEXT NOT NULL DEFAULT '',
    lease_until       INTEGER NOT NULL DEFAULT 0,
    since             INTEGER NOT NULL DEFAULT 0,
    last_fire_served  INTEGER NOT NULL DEFAULT 0,
    prev_agent_id     TEXT NOT NULL DEFAULT '',
    prev_since        INTEGER NOT NULL DEFAULT 0,
    prev_lease_until  INTEGER NOT NULL DEFAULT 0,
    released_at       INTEGER NOT NULL DEFAULT 0,
    move_to           TEXT NOT NULL DEFAULT '',
    move_requested_at INTEGER NOT NULL DEFAULT 0,
    updated_at        INTEGER NOT NULL
);
