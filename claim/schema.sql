-- The claim table: one row per idempotency key. {{table}}, {{live_index}}
-- and {{pending_index}} are replaced by the configured, quoted names.
CREATE TABLE IF NOT EXISTS {{table}} (
    key         text        PRIMARY KEY CHECK (key <> '' AND length(key) <= 255),
    customer    text        NOT NULL CHECK (customer <> '' AND length(customer) <= 255),
    period      text        NOT NULL CHECK (period <> '' AND length(period) <= 255),
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    state       text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    stripe_id   text        NOT NULL DEFAULT '',
    attempts    integer     NOT NULL DEFAULT 1,
    owner       text        NOT NULL DEFAULT '',
    lease_until timestamptz NOT NULL DEFAULT now(),
    last_error  text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (state <> 'succeeded' OR stripe_id <> '')
);

-- At most one live (pending or succeeded) claim per customer and period.
-- A failed claim is terminal for its key and no longer holds the period:
-- billing again is an explicit new claim under a new key.
CREATE UNIQUE INDEX IF NOT EXISTS {{live_index}} ON {{table}} (customer, period) WHERE state <> 'failed';

-- Reconciliation lists pending claims by age.
CREATE INDEX IF NOT EXISTS {{pending_index}} ON {{table}} (created_at) WHERE state = 'pending';

-- Where the key went, and the start of its current window.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '';
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 0;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS endpoint text NOT NULL DEFAULT '';
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS credential text NOT NULL DEFAULT '';
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS first_sent_at timestamptz;
UPDATE {{table}} SET first_sent_at = created_at WHERE first_sent_at IS NULL;
ALTER TABLE {{table}} ALTER COLUMN first_sent_at SET DEFAULT now();
ALTER TABLE {{table}} ALTER COLUMN first_sent_at SET NOT NULL;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS reconciled_at timestamptz;
