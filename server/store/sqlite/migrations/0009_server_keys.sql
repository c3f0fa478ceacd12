-- The server's key material when it lives in the store (docs/postgres.md,
-- "Keys and the KEK"): each row sealed with AES-256-GCM under the
-- key-encryption key, its id as additional data. A SQLite server keeps its
-- keys in the data dir; the table exists so that both stores have the same
-- schema (drover-server migrate --to fills it in PostgreSQL).

CREATE TABLE server_keys (
	id TEXT PRIMARY KEY,
	sealed BLOB NOT NULL,
	version INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
