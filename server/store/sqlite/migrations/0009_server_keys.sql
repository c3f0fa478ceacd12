-- Placeholder on this branch only: migration 0009 (server keys) belongs to
-- the key-encryption work. At merge, keep that branch's file and drop this one.
SELECT 1;
