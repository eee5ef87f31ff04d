-- The Stripe account a claim's key goes to: a connected account's id
-- ("acct_…"), whose objects a platform makes with the Stripe-Account
-- header, or "" for the platform's own account. A customer, an invoice or
-- a meter of one account means nothing on another, so the account is part
-- of a claim's identity: a request for the same customer and period under
-- another account meets the claim and is refused, as a request with
-- another amount is, and an update about another account's object never
-- moves it.
--
-- Every existing claim is the platform's: the column's default, "", is
-- what claims made before this migration mean. A column with a constant
-- default is added without rewriting the table (PostgreSQL 11 and later),
-- and asks for no extension and no privilege beyond the table's
-- ownership; the check is added NOT VALID, since every existing row holds
-- the default.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS account text NOT NULL DEFAULT '';  -- the connected account the key goes to; '' for the platform
ALTER TABLE billonce_claims
    DROP CONSTRAINT IF EXISTS account_known,
    ADD CONSTRAINT account_known CHECK (length(account) <= 255) NOT VALID;

INSERT INTO billonce_claims_migrations (version, name) VALUES (12, 'accounts') ON CONFLICT (version) DO NOTHING;
