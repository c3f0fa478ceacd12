-- Which replica holds each agent's live stream, refreshed by that replica
-- (seen_at) and dropped when the stream ends; a claim not refreshed within
-- the presence expiry is stale (its replica died). A single server keeps
-- presence in memory and leaves this table empty.
CREATE TABLE agent_streams (
  agent_id TEXT PRIMARY KEY,
  replica  TEXT NOT NULL,
  seen_at  INTEGER NOT NULL
);
CREATE INDEX agent_streams_replica ON agent_streams(replica);
CREATE INDEX agent_streams_seen ON agent_streams(seen_at);

-- Web console sessions. The cookie's value is never stored: id_hash is its
-- SHA-256; the CSRF token is derived from the cookie value.
CREATE TABLE console_sessions (
  id_hash      BLOB PRIMARY KEY,
  token_id     TEXT NOT NULL,
  created_at   INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL
);
CREATE INDEX console_sessions_created ON console_sessions(created_at);
CREATE INDEX console_sessions_seen ON console_sessions(last_seen_at);
CREATE INDEX console_sessions_token ON console_sessions(token_id);
