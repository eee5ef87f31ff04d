-- A usage report's identity as columns of its own: the meter's event name
-- and the window the usage was measured in, start inclusive, end
-- exclusive. NULL for every other claim.
--
-- Stripe's meter adds up every event of a customer: two reports whose
-- windows overlap count the overlap twice. So no two live (not failed)
-- claims of one customer and meter may have overlapping windows, whatever
-- their scope, run or replica, unless the windows are the same (the
-- totals of one window, each a claim of its own). Adjacent windows, one
-- ending where the other starts, do not overlap. Two exclusion
-- constraints say it, one for a different start and one for a different
-- end: an exclusion constraint conflicts when every one of its operators
-- holds, and "overlaps but is not the same window" is an "or" of the two.
-- They hold under concurrency as a unique index does: of two overlapping
-- claims committed at once, one waits for the other and then finds it.
--
-- The constraints need the btree_gist extension (for = and <> on text and
-- timestamps in a GiST index). It ships with PostgreSQL and is trusted
-- since PostgreSQL 13: a role with CREATE on the database may create it,
-- no superuser needed. On a managed PostgreSQL it may have to be allowed
-- first (Azure's flexible server: the azure.extensions parameter; Amazon
-- RDS: rds.allowed_extensions, where it is set), or be created by the
-- service's administrator role (Google Cloud SQL: cloudsqlsuperuser).
-- Where this role cannot create it, have the database's owner run
-- CREATE EXTENSION btree_gist; once, in this database, then migrate again;
-- an extension that exists already is all this migration needs.
--
-- Usage claims made before this migration get their meter and window
-- start back from their period ("usage <meter> <start> ..."), but no
-- window end: their key holds it, hashed. They keep their period's rule
-- (no two reports of one customer and meter start at the same minute)
-- and take no part in the overlap check.
CREATE EXTENSION IF NOT EXISTS btree_gist;
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS meter text;                -- a usage report's meter event name; NULL for other claims
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS window_start timestamptz;  -- the start of a usage report's window (inclusive)
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS window_end timestamptz;    -- the end of a usage report's window (exclusive); NULL for reports made before this migration
UPDATE billonce_claims SET meter = split_part(period, ' ', 2), window_start = split_part(period, ' ', 3)::timestamptz
    WHERE meter IS NULL AND endpoint = 'meter_events'
        AND period ~ '^usage [^ ]+ [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z (increment|total [0-9]+)$';
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS usage_window_known,
    ADD CONSTRAINT usage_window_known CHECK ((meter IS NULL) = (window_start IS NULL) AND (window_end IS NULL OR window_start < window_end) AND length(meter) <= 255),
    DROP CONSTRAINT IF EXISTS billonce_claims_windows_start,
    ADD CONSTRAINT billonce_claims_windows_start EXCLUDE USING gist
        (customer WITH =, meter WITH =, tstzrange(window_start, window_end) WITH &&, window_start WITH <>)
        WHERE (state <> 'failed' AND window_end IS NOT NULL),
    DROP CONSTRAINT IF EXISTS billonce_claims_windows_end,
    ADD CONSTRAINT billonce_claims_windows_end EXCLUDE USING gist
        (customer WITH =, meter WITH =, tstzrange(window_start, window_end) WITH &&, window_end WITH <>)
        WHERE (state <> 'failed' AND window_end IS NOT NULL);

INSERT INTO billonce_claims_migrations (version, name) VALUES (6, 'usage_windows') ON CONFLICT (version) DO NOTHING;
