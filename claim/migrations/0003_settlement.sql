-- Payments that settle later (bank debits: ACH, SEPA, BACS) and the Stripe
-- events that settle them. A claim whose payment exists but has not settled
-- is 'processing': it holds its period like a succeeded claim, is never sent
-- again, and becomes 'succeeded' or 'failed' when the outcome arrives.
--
-- PostgreSQL named the first migration's check on state after the table
-- (billonce_claims_state_check); it is replaced by one that knows
-- 'processing'.
ALTER TABLE billonce_claims DROP CONSTRAINT IF EXISTS billonce_claims_state_check;
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS state_known,
    ADD CONSTRAINT state_known CHECK (state IN ('pending', 'processing', 'succeeded', 'failed')),
    DROP CONSTRAINT IF EXISTS processing_has_stripe_id,
    ADD CONSTRAINT processing_has_stripe_id CHECK (state <> 'processing' OR stripe_id <> '');
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS processing_at timestamptz;               -- when the payment was first known to be processing; NULL if it never was
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS settled_at timestamptz;                  -- when a processing payment's outcome was recorded
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS failure_code text NOT NULL DEFAULT '';   -- Stripe's failure code of a payment that failed after processing
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS refunded bigint NOT NULL DEFAULT 0;      -- amount refunded so far (Stripe's amount_refunded); never a reason to bill again
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS dispute text NOT NULL DEFAULT '';        -- the latest dispute: its id and reason
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS event_at timestamptz;                    -- Stripe's creation time of the latest event (or read) applied
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS refunded_not_negative,
    ADD CONSTRAINT refunded_not_negative CHECK (refunded >= 0);

-- Reconciliation polls processing claims by age.
CREATE INDEX IF NOT EXISTS billonce_claims_processing ON billonce_claims (processing_at) WHERE state = 'processing';

-- Every Stripe event applied to the claim table, by id, recorded in the
-- transaction that applies it: a redelivered event finds its row and
-- changes nothing.
CREATE TABLE IF NOT EXISTS billonce_claims_events (
    id          text        PRIMARY KEY CHECK (id <> '' AND length(id) <= 255),
    type        text        NOT NULL CHECK (length(type) <= 255),
    key         text        NOT NULL CHECK (length(key) <= 255),
    stripe_id   text        NOT NULL CHECK (length(stripe_id) <= 255),
    created     timestamptz NOT NULL,
    result      text        NOT NULL DEFAULT '',
    received_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO billonce_claims_migrations (version, name) VALUES (3, 'settlement') ON CONFLICT (version) DO NOTHING;
