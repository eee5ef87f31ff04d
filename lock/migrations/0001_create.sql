-- The lease table: one row per held lease, named by namespace and name,
-- with its holder's owner token and its expiry on the database clock.
CREATE TABLE IF NOT EXISTS billonce_lock_leases (
    namespace  text        NOT NULL,
    name       text        NOT NULL,
    owner      text        NOT NULL,
    locked_at  timestamptz NOT NULL,
    lock_until timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- Which migrations the lease table has had: each migration lists itself.
CREATE TABLE IF NOT EXISTS billonce_lock_leases_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO billonce_lock_leases_migrations (version, name) VALUES (1, 'create') ON CONFLICT (version) DO NOTHING;
