-- A declined period is re-billed only from the scope that claimed it: a
-- claim of another scope (a renamed Biller scope sharing the claim table)
-- for a customer and period that has a failed claim of a known scope is
-- refused, since billing it would re-bill a declined period without a
-- person's decision, and charge twice if the customer then completes the
-- declined payment. The claim statement looks for such failed claims;
-- this index finds them without reading the customer's other claims.
--
-- A plain btree index: no extension, no privilege beyond the table's
-- ownership that the earlier migrations needed, the same on a managed
-- PostgreSQL as on any other. Migrations run in a transaction, where
-- CREATE INDEX CONCURRENTLY is not allowed, so building it holds the
-- claim table's SHARE lock until the migration commits: claims and their
-- outcomes wait for it (reads do not), for as long as reading the failed
-- claims takes. A table with millions of rows can have it built first,
-- without that lock, by running CREATE INDEX CONCURRENTLY with this name,
-- columns and predicate outside a transaction (should that fail, drop the
-- invalid index it leaves and run it again); this migration then finds it.
CREATE INDEX IF NOT EXISTS billonce_claims_failed ON billonce_claims (customer, period) WHERE state = 'failed';

INSERT INTO billonce_claims_migrations (version, name) VALUES (9, 'failed_periods') ON CONFLICT (version) DO NOTHING;
