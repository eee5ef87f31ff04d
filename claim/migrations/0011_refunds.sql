-- A refund is a claim of its own, of the payment claim it refunds:
-- refund_of is that claim's key, NULL for every other claim. The refunds
-- of one payment never add up to more than it: a refund is claimed only
-- while the payment's claim is succeeded and its live (not failed)
-- refunds, with the new one, come to no more than its amount. The claim
-- statement of a refund runs in a transaction that first takes a
-- transaction-level advisory lock on the payment's key, so that it reads
-- the payment's refunds after every other refund of it committed: two
-- refunds of one payment are claimed one after the other, on any number
-- of replicas. The index finds a payment's refunds for that sum.
--
-- A refund's claim is sent to refunds or credit notes, never elsewhere: a
-- build of billonce from before refunds, which does not know refund_of,
-- would resume a pending refund's claim as a charge, and the check makes
-- its reopening of the claim's key fail before anything is sent.
--
-- A nullable column with no default is added without rewriting the
-- table; every existing row is NULL, which the index leaves out, so
-- building it reads the table once under its SHARE lock, a moment. A
-- plain btree index and a check: no extension and no privilege beyond
-- the table's ownership.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS refund_of text;  -- the key of the payment claim a refund refunds; NULL for other claims
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS refund_known,
    ADD CONSTRAINT refund_known CHECK (refund_of IS NULL OR length(refund_of) <= 255 AND refund_of <> key AND endpoint IN ('refunds', 'credit_notes')) NOT VALID;
CREATE INDEX IF NOT EXISTS billonce_claims_refunds ON billonce_claims (refund_of) WHERE refund_of IS NOT NULL;

INSERT INTO billonce_claims_migrations (version, name) VALUES (11, 'refunds') ON CONFLICT (version) DO NOTHING;
