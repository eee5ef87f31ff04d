-- The Stripe id of a usage report's meter ("mtr_…"), recorded when the
-- report is claimed. A meter's event name ("api_calls") may name a meter
-- on each of several Stripe accounts whose reports share one claim table
-- (a scope each), and a meter event's identifier is whatever its sender
-- chose; the meter's id names one meter on one account. A meter error
-- report, which names its meter by id, fails a usage claim only if the
-- claim recorded that id.
--
-- Usage claims made before this migration keep NULL: their meter's id is
-- unknown, so no meter error report moves them (each is logged, for a
-- person to compare the meter's summary with the records). Other claims
-- keep NULL.
--
-- A nullable column with no default is added without rewriting the table
-- and asks for no extension and no privilege beyond the table's
-- ownership, which the earlier migrations needed too; the ALTER holds the
-- table's ACCESS EXCLUSIVE lock until the migration commits, a moment.
-- Every existing row is NULL, which the check accepts, so the check is
-- added NOT VALID, without a scan of the table under that lock; it holds
-- for every row written from now on.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS meter_id text;  -- a usage report's meter's Stripe id; NULL for other claims and for usage claims made before this migration
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS usage_meter_id_known,
    ADD CONSTRAINT usage_meter_id_known CHECK (meter_id IS NULL OR (meter IS NOT NULL AND length(meter_id) <= 255)) NOT VALID;

INSERT INTO billonce_claims_migrations (version, name) VALUES (7, 'meter_ids') ON CONFLICT (version) DO NOTHING;
