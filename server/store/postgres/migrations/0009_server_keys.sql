-- The server's key material shared by every replica (docs/postgres.md,
-- "Keys and the KEK"): each row sealed with AES-256-GCM under the
-- key-encryption key, its id as additional data. Nothing in it is in the
-- clear.

CREATE TABLE server_keys (
	id TEXT COLLATE "C" PRIMARY KEY,
	sealed BYTEA NOT NULL,
	version BIGINT NOT NULL,
	updated_at BIGINT NOT NULL
);
