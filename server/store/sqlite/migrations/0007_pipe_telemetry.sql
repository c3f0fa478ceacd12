-- Pipe telemetry: what a run wrote to $DROVER_OUTPUT (key=value text) and
-- $DROVER_METRICS (a JSON array of samples), and the notes saying what was
-- cut (a JSON array of strings), as RunFinished carried them.

ALTER TABLE runs ADD COLUMN output TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN metrics TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN telemetry_notes TEXT NOT NULL DEFAULT '';
