-- Pipe telemetry: what a run wrote to $DROVER_OUTPUT (text) and
-- $DROVER_METRICS (a JSON array of samples), and the notes saying what was
-- cut (a JSON array of strings), as RunFinished carried them. TEXT, not
-- JSONB: a label value may hold an escaped NUL, which JSONB refuses.

ALTER TABLE runs ADD COLUMN output TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN metrics TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN telemetry_notes TEXT COLLATE "C" NOT NULL DEFAULT '';
