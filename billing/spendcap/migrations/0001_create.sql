-- Vault keys, named by KeyID (a hash: no key is stored in clear), with the
-- spend of their current window.
CREATE TABLE IF NOT EXISTS spendcap_keys (
    key_id            text        PRIMARY KEY CHECK (key_id <> ''),
    cap_amount        bigint      NOT NULL CHECK (cap_amount > 0),
    per               text        NOT NULL CHECK (per IN ('run', 'day')),
    allowed_endpoints text[],                                   -- NULL allows every endpoint
    expires_at        timestamptz,                              -- NULL never expires
    revoked_at        timestamptz,
    window_start      timestamptz NOT NULL DEFAULT '0001-01-01 00:00:00+00',
    spent             bigint      NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved          bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    label             text        NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- Amounts held while their requests are in flight. A row left behind by a
-- crashed replica keeps its amount reserved: the cap is reached early,
-- never passed.
CREATE TABLE IF NOT EXISTS spendcap_reservations (
    id              bigserial   PRIMARY KEY,
    key_id          text        NOT NULL REFERENCES spendcap_keys (key_id) ON DELETE CASCADE,
    idempotency_key text        NOT NULL DEFAULT '',
    amount          bigint      NOT NULL CHECK (amount > 0),
    reserved_at     timestamptz NOT NULL,
    since           timestamptz NOT NULL,
    count_for_us    bigint      NOT NULL             -- microseconds
);

-- What the proxy knows of each idempotency key, over every vault key.
CREATE TABLE IF NOT EXISTS spendcap_idempotency (
    idempotency_key text        PRIMARY KEY,
    chain_start     timestamptz NOT NULL DEFAULT '0001-01-01 00:00:00+00',
    last_forward    timestamptz NOT NULL DEFAULT '0001-01-01 00:00:00+00',
    counted_until   timestamptz NOT NULL DEFAULT '0001-01-01 00:00:00+00'
);
CREATE INDEX IF NOT EXISTS spendcap_idempotency_last_forward ON spendcap_idempotency (last_forward);

-- One row per request answered; never a secret, never a vault key.
CREATE TABLE IF NOT EXISTS spendcap_audit (
    id              bigserial   PRIMARY KEY,
    at              timestamptz NOT NULL,
    key_id          text        NOT NULL,
    method          text        NOT NULL,
    path            text        NOT NULL,
    idempotency_key text        NOT NULL,
    amount          bigint      NOT NULL,
    status          integer     NOT NULL,
    refused         text        NOT NULL,
    replayed        boolean     NOT NULL,
    kept            boolean     NOT NULL
);
CREATE INDEX IF NOT EXISTS spendcap_audit_key ON spendcap_audit (key_id, at);

-- Which migrations the tables have had: each migration lists itself.
CREATE TABLE IF NOT EXISTS spendcap_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO spendcap_migrations (version, name) VALUES (1, 'create') ON CONFLICT (version) DO NOTHING;
