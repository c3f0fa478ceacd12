-- Placement: one. The holder of each such pipe, its lease, and while a
-- hand-over waits for it, the lease of the holder before (the fence);
-- times are Unix nanoseconds, 0 for none.

CREATE TABLE pipe_holders (
    pipe              TEXT COLLATE "C" PRIMARY KEY,
    agent_id          TEXT COLLATE "C" NOT NULL DEFAULT '',
    lease_until       BIGINT NOT NULL DEFAULT 0,
    since             BIGINT NOT NULL DEFAULT 0,
    last_fire_served  BIGINT NOT NULL DEFAULT 0,
    prev_agent_id     TEXT COLLATE "C" NOT NULL DEFAULT '',
    prev_since        BIGINT NOT NULL DEFAULT 0,
    prev_lease_until  BIGINT NOT NULL DEFAULT 0,
    released_at       BIGINT NOT NULL DEFAULT 0,
    move_to           TEXT COLLATE "C" NOT NULL DEFAULT '',
    move_requested_at BIGINT NOT NULL DEFAULT 0,
    updated_at        BIGINT NOT NULL
);
