-- Records of applied Stripe events are pruned once they are older than
-- any redelivery (Postgres.PruneEvents), oldest first and a batch at a
-- time: this index finds them without reading the whole table.
--
-- Building it locks the events table against new records (and so delays
-- webhook deliveries) for as long as it takes. A table that has grown to
-- millions of rows can have it built first, without that lock, by running
-- CREATE INDEX CONCURRENTLY with this name and column outside a
-- transaction; this migration then finds it.
CREATE INDEX IF NOT EXISTS billonce_claims_events_received ON billonce_claims_events (received_at);

-- Stripe's creation time of the recorded dispute: a dispute delivered
-- late replaces the recorded one only if it is newer, whatever other
-- events came in between (and so also when it is delivered again after
-- its record was pruned). NULL for a dispute recorded before this column;
-- event_at stands in for it.
ALTER TABLE billonce_claims ADD COLUMN IF NOT EXISTS dispute_at timestamptz;

INSERT INTO billonce_claims_migrations (version, name) VALUES (4, 'event_pruning') ON CONFLICT (version) DO NOTHING;
