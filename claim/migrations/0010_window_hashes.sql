-- The exclusion constraints that keep a customer's usage windows of one
-- meter apart (migration 6) led their GiST indexes with the customer and
-- the meter as text: every claim of every customer, inserted or moved
-- out of pending, compared text ranges at each level of both indexes,
-- and that cost grew with the table. Led by an int8 hash of the customer
-- and the meter, each index reaches one customer's meter in a few pages.
-- The customer and the meter stay in the constraints: a hash that
-- collides costs a comparison, never a refusal, and the rows excluded are
-- exactly migration 6's.
--
-- Rebuilding the constraints builds both indexes again, under the claim
-- table's ACCESS EXCLUSIVE lock until the migration commits: claims, and
-- reads of them, wait for it, for as long as reading the usage claims
-- takes. Run it when no billing runs.
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS billonce_claims_windows_start,
    ADD CONSTRAINT billonce_claims_windows_start EXCLUDE USING gist
        (hashtextextended(customer || ' ' || meter, 0) WITH =, tstzrange(window_start, window_end) WITH &&,
         customer WITH =, meter WITH =, window_start WITH <>)
        WHERE (state <> 'failed' AND window_end IS NOT NULL),
    DROP CONSTRAINT IF EXISTS billonce_claims_windows_end,
    ADD CONSTRAINT billonce_claims_windows_end EXCLUDE USING gist
        (hashtextextended(customer || ' ' || meter, 0) WITH =, tstzrange(window_start, window_end) WITH &&,
         customer WITH =, meter WITH =, window_end WITH <>)
        WHERE (state <> 'failed' AND window_end IS NOT NULL);

INSERT INTO billonce_claims_migrations (version, name) VALUES (10, 'window_hashes') ON CONFLICT (version) DO NOTHING;
