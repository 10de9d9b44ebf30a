-- Inbound journal states beyond pending/delivered (albums, capabilities, /drop, expiry). SQLite cannot change a CHECK
-- constraint in place, so the table is rebuilt; rows, seqs and the AUTOINCREMENT high-water mark
-- are kept (a delivery id "d-<seq>" is never handed out twice, even after purged rows).
--   gathering  an album part, journaled as it arrived, waiting for the rest of its album
--   merged     an album part folded into its album's first row (which carries every file)
--   skipped    settled unsent: the follower does not take this delivery type (docs/protocol.md, "Capabilities")
--   dropped    discarded by the owner with /drop
--   expired    older than TOPICBUS_OFFLINE_TTL_S before it could be delivered
-- media_group: Telegram's media_group_id of an album part. reported_at_ms: when the topic was
-- told that the row expired (NULL until then).
CREATE TABLE inbound_journal_v3 (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    update_id       INTEGER NOT NULL UNIQUE,
    binding_key     TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'gathering', 'delivered', 'merged', 'skipped', 'dropped', 'expired')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at_ms   INTEGER NOT NULL,
    delivered_at_ms INTEGER,
    media_group     TEXT,
    reported_at_ms  INTEGER
);
INSERT INTO inbound_journal_v3 (seq, update_id, binding_key, payload, status, attempts, created_at_ms, delivered_at_ms)
    SELECT seq, update_id, binding_key, payload, status, attempts, created_at_ms, delivered_at_ms FROM inbound_journal;
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'inbound_journal_v3', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'inbound_journal_v3');
UPDATE sqlite_sequence
    SET seq = (SELECT MAX(seq) FROM sqlite_sequence WHERE name IN ('inbound_journal', 'inbound_journal_v3'))
    WHERE name = 'inbound_journal_v3';
DROP TABLE inbound_journal;
ALTER TABLE inbound_journal_v3 RENAME TO inbound_journal;
CREATE INDEX inbound_journal_pending ON inbound_journal (binding_key, seq) WHERE status IN ('pending', 'gathering');
CREATE INDEX inbound_journal_expired ON inbound_journal (binding_key) WHERE status = 'expired' AND reported_at_ms IS NULL;
