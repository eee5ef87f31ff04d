-- What a claim knows about where its key went and the window of Stripe's
-- idempotency deadline. Rows made before this migration get the "unknown"
-- values and first_sent_at = created_at: their key may have reached Stripe
-- as soon as the claim existed.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '';          -- the Biller scope that made the claim; '' = unknown (made before v2)
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 0;       -- re-bill attempt number, 1 = first charge; 0 = unknown
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS endpoint text NOT NULL DEFAULT '';       -- where the key is sent ('charges', 'payment_intents'); '' = unknown
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS credential text NOT NULL DEFAULT '';     -- non-secret fingerprint of the credential that sends the key; '' = unknown
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS first_sent_at timestamptz;               -- start of the key's current window: the earliest time the key may have reached Stripe
UPDATE billonce_claims SET first_sent_at = created_at WHERE first_sent_at IS NULL;
ALTER TABLE billonce_claims ALTER COLUMN first_sent_at SET DEFAULT now();
ALTER TABLE billonce_claims ALTER COLUMN first_sent_at SET NOT NULL;
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS reconciled_at timestamptz;               -- when a search after the window's deadline last found no payment for the key

-- Checks in the spirit of the first migration. PostgreSQL has no ADD
-- CONSTRAINT IF NOT EXISTS: dropping and adding again in one statement keeps
-- this idempotent without a DO block, which some migration tools split on
-- its semicolons.
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS scope_length,
    ADD CONSTRAINT scope_length CHECK (length(scope) <= 255),
    DROP CONSTRAINT IF EXISTS attempt_not_negative,
    ADD CONSTRAINT attempt_not_negative CHECK (attempt >= 0),
    DROP CONSTRAINT IF EXISTS endpoint_length,
    ADD CONSTRAINT endpoint_length CHECK (length(endpoint) <= 255),
    DROP CONSTRAINT IF EXISTS credential_length,
    ADD CONSTRAINT credential_length CHECK (length(credential) <= 255);

INSERT INTO billonce_claims_migrations (version, name) VALUES (2, 'identity') ON CONFLICT (version) DO NOTHING;
