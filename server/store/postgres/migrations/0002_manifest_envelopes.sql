-- Envelopes move out of the manifests table, so that the compiler's scan of
-- every agent's manifest metadata reads small rows only.
CREATE TABLE manifest_envelopes (
    agent_id TEXT COLLATE "C" PRIMARY KEY,
    envelope BYTEA NOT NULL
);
INSERT INTO manifest_envelopes(agent_id, envelope) SELECT agent_id, envelope FROM manifests;
ALTER TABLE manifests DROP COLUMN envelope;
