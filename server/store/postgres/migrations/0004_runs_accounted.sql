-- Every run accounted for: why a run ended (reason), how many attempts it
-- made and who wrote its final record; the host identity bound to an agent
-- (machine_id) and what its streams reported about it.

ALTER TABLE runs ADD COLUMN reason TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN written_by TEXT COLLATE "C" NOT NULL DEFAULT '';
-- How many drained heartbeats in a row did not list this unfinished run.
ALTER TABLE runs ADD COLUMN unlisted BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_reason ON runs(reason) WHERE reason <> '';
CREATE INDEX runs_scheduled ON runs(scheduled_at) WHERE scheduled_at <> 0;
CREATE INDEX runs_agent_status ON runs(agent_id, status);

ALTER TABLE agents ADD COLUMN machine_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN reported_hostname TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN manifest_expired BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE agents ADD COLUMN manifest_expires_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN identity_conflicts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN identity_conflict_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN identity_conflict_machine TEXT COLLATE "C" NOT NULL DEFAULT '';
