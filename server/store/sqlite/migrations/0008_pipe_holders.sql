-- Placeholder on this branch only: migration 0008 (pipe holders) belongs to
-- the placement work. At merge, keep that branch's file and drop this one.
SELECT 1;
