-- The claim table: one row per idempotency key.
CREATE TABLE IF NOT EXISTS billonce_claims (
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
CREATE UNIQUE INDEX IF NOT EXISTS billonce_claims_live ON billonce_claims (customer, period) WHERE state <> 'failed';

-- Reconciliation lists pending claims by age.
CREATE INDEX IF NOT EXISTS billonce_claims_pending ON billonce_claims (created_at) WHERE state = 'pending';

-- Which migrations the claim table has had: each migration lists itself.
CREATE TABLE IF NOT EXISTS billonce_claims_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO billonce_claims_migrations (version, name) VALUES (1, 'create') ON CONFLICT (version) DO NOTHING;
