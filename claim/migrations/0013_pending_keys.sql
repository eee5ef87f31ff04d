-- The claim statement takes over a pending claim by its key. The pending
-- claims were indexed by the time they were made, which no statement
-- needs in order, and a batch's plan read every pending claim to find the
-- few it names: a run killed or held up by an outage leaves many, and
-- each later batch of every run read them all. This index holds the
-- pending claims by key, so that a batch reads only the pending claims
-- it names (with the statement's own list of keys), and its entries go
-- to random places rather than all to the end of one index, where
-- concurrent claims met. The index by time is dropped: every claim wrote
-- to it, and the stale-claims listing reads the pending claims just as
-- well from this one.
--
-- A plain btree index: no extension, no privilege beyond the table's
-- ownership. Built inside the migration's transaction, it holds the
-- claim table's SHARE lock while it reads the pending claims (few, on a
-- healthy table): claims and outcomes wait, reads do not; dropping the
-- old index takes the ACCESS EXCLUSIVE lock for a moment. A table with
-- very many pending claims can have it built first by running CREATE
-- INDEX CONCURRENTLY with this name, column and predicate outside a
-- transaction (should that fail, drop the invalid index it leaves and run
-- it again: this migration would keep an invalid index of that name and
-- drop the old one); this migration then finds it.
CREATE INDEX IF NOT EXISTS billonce_claims_pending_keys ON billonce_claims (key) WHERE state = 'pending';
DROP INDEX IF EXISTS billonce_claims_pending;

INSERT INTO billonce_claims_migrations (version, name) VALUES (13, 'pending_keys') ON CONFLICT (version) DO NOTHING;
