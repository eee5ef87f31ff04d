-- Whether a pending claim's key is known never to have executed at
-- Stripe although Stripe refused it as one it has seen: a usage report
-- whose meter event identifier another writer took (another claim table,
-- or one restored from an older backup). A resume of such a claim must
-- not take Stripe's "already exists" for its own event. It is state, set
-- with the claim's release and cleared when a lookup reopens the key's
-- window.
--
-- Claims released that way before this migration said so at the start of
-- their last error; they are marked from it.
--
-- A column with a constant default is added without rewriting the table
-- (PostgreSQL 11 and later) and asks for no extension and no privilege
-- beyond the table's ownership; the UPDATE touches only such claims.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS unsent boolean NOT NULL DEFAULT false;  -- the key is known never to have executed at Stripe, though Stripe refused it as seen
UPDATE billonce_claims SET unsent = true WHERE state = 'pending' AND NOT unsent AND last_error LIKE 'identifier taken: %';

INSERT INTO billonce_claims_migrations (version, name) VALUES (8, 'unsent') ON CONFLICT (version) DO NOTHING;
