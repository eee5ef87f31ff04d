-- The fencing token of each lease: a number that grows with every new
-- holder (the PostgreSQL transaction id of the statement that took the
-- lease), set when a lease is taken and kept while it is renewed. A
-- write that must come from the current holder checks, in its own
-- statement, that the lease row still carries its holder's token:
--
--     INSERT INTO ... SELECT ... FROM billonce_lock_leases WHERE token = $1 FOR SHARE
--
-- Rows written before this migration have none (NULL) until they are
-- taken again; each token is unique.
ALTER TABLE billonce_lock_leases ADD COLUMN IF NOT EXISTS token bigint;
CREATE UNIQUE INDEX IF NOT EXISTS billonce_lock_leases_token ON billonce_lock_leases (token);

INSERT INTO billonce_lock_leases_migrations (version, name) VALUES (2, 'token') ON CONFLICT (version) DO NOTHING;
