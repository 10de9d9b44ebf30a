-- The outbound scheduler reads per-topic heads without payloads: each row carries what the
-- scheduler needs to plan (priority, size in UTF-16 units, format, whether it has buttons), and the
-- Telegram message id it went out in. New kinds: photos from agents. The table is rebuilt because
-- SQLite cannot change a CHECK constraint in place.
CREATE TABLE outbox_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    binding_key   TEXT    NOT NULL,
    chat_id       INTEGER NOT NULL,
    thread_id     INTEGER,
    instance_id   TEXT    NOT NULL,
    request_id    TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('text', 'chatAction', 'document', 'photo', 'notice')),
    priority      INTEGER NOT NULL DEFAULT 2,
    units         INTEGER NOT NULL DEFAULT 0,
    bytes         INTEGER NOT NULL DEFAULT 0,
    format        TEXT,
    has_buttons   INTEGER NOT NULL DEFAULT 0,
    payload       TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    created_at_ms INTEGER NOT NULL,
    sent_at_ms    INTEGER,
    message_id    INTEGER,
    UNIQUE (instance_id, request_id)
);
INSERT INTO outbox_new (id, binding_key, chat_id, thread_id, instance_id, request_id, kind, priority, units, bytes,
                        payload, status, attempts, last_error, created_at_ms, sent_at_ms)
    SELECT id, binding_key, chat_id, thread_id, instance_id, request_id, kind,
           CASE kind WHEN 'notice' THEN 0 ELSE 2 END,
           COALESCE(length(json_extract(payload, '$.text')), 0), length(payload),
           payload, status, attempts, last_error, created_at_ms, sent_at_ms
    FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;
CREATE INDEX outbox_pending_topic ON outbox (chat_id, thread_id, id) WHERE status = 'pending';
CREATE INDEX outbox_pending_binding ON outbox (binding_key) WHERE status = 'pending';
