-- Claims of other Stripe writes than a single payment.
--
-- A claim may now stand for a usage report (a meter event: its amount is
-- the reported quantity and it has no currency) or for an invoice, made in
-- steps (draft, lines, finalize, pay or send). step is the recovery point
-- of such a claim: the last step known to be done at Stripe, '' for none
-- and for single payments; stripe_id names the object the steps build on
-- (the draft invoice) from the first step on, while the claim is pending.
--
-- PostgreSQL named the first migration's check on currency after the
-- table (billonce_claims_currency_check); it is replaced by one that
-- accepts no currency.
ALTER TABLE billonce_claims DROP CONSTRAINT IF EXISTS billonce_claims_currency_check;
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS step text NOT NULL DEFAULT '';
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS currency_known,
    ADD CONSTRAINT currency_known CHECK (currency = '' OR currency ~ '^[a-z]{3}$'),
    DROP CONSTRAINT IF EXISTS step_length,
    ADD CONSTRAINT step_length CHECK (length(step) <= 255);

INSERT INTO billonce_claims_migrations (version, name) VALUES (5, 'steps') ON CONFLICT (version) DO NOTHING;
