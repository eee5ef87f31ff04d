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
