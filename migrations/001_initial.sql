-- topicbus schema v1: the durable domain (lease, bindings, intents, journal; docs/architecture.md, "Storage").

-- The leader lease: exactly one row names the current leader and its epoch.
CREATE TABLE leader_lease (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    owner           TEXT    NOT NULL,
    epoch           INTEGER NOT NULL CHECK (epoch > 0),
    heartbeat_at_ms INTEGER NOT NULL
);

-- Settings changed from Telegram (cleanup policy, display mode); they win over the environment.
CREATE TABLE runtime_settings (
    key           TEXT PRIMARY KEY,
    value         TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
);

-- Workspace bindings: the durable "this workspace owns this topic" fact.
CREATE TABLE workspace_bindings (
    binding_key       TEXT PRIMARY KEY,
    kind              TEXT NOT NULL CHECK (kind IN ('leader', 'follower')),
    host_id           TEXT NOT NULL DEFAULT '',
    cwd               TEXT NOT NULL DEFAULT '',
    session           TEXT NOT NULL DEFAULT '',
    slot              TEXT UNIQUE CHECK (slot IS NULL OR (length(slot) = 1 AND slot BETWEEN 'A' AND 'Z')),
    chat_id           INTEGER NOT NULL,
    thread_id         INTEGER,
    topic_state       TEXT NOT NULL DEFAULT 'open' CHECK (topic_state IN ('open', 'closed', 'deleted')),
    thread_name       TEXT NOT NULL,
    manual_name       TEXT,
    display_title     TEXT,
    inactive_since_ms INTEGER,
    offline_notified  INTEGER NOT NULL DEFAULT 0,
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL
);
CREATE UNIQUE INDEX workspace_bindings_target ON workspace_bindings (chat_id, thread_id)
    WHERE thread_id IS NOT NULL AND topic_state != 'deleted';

-- Routeable owner records: which live registration currently owns a binding's topic.
CREATE TABLE target_owners (
    binding_key             TEXT PRIMARY KEY REFERENCES workspace_bindings (binding_key) ON DELETE CASCADE,
    instance_id             TEXT    NOT NULL,
    registration_generation TEXT    NOT NULL,
    pid                     INTEGER,
    process_birth_id        TEXT,
    host_id                 TEXT,
    updated_at_ms           INTEGER NOT NULL
);

-- Durable destructive intent: written before any Telegram close/delete of a follower topic.
CREATE TABLE pending_cleanups (
    id                      TEXT PRIMARY KEY,
    binding_key             TEXT    NOT NULL,
    instance_id             TEXT    NOT NULL,
    registration_generation TEXT    NOT NULL,
    chat_id                 INTEGER NOT NULL,
    thread_id               INTEGER NOT NULL,
    reason                  TEXT    NOT NULL,
    requested_at_ms         INTEGER NOT NULL,
    last_error              TEXT
);

-- Pressure retirement of an inactive binding (slot rotation); at most one exists in practice.
CREATE TABLE retirement_intents (
    id                TEXT PRIMARY KEY,
    binding_key       TEXT    NOT NULL,
    binding_snapshot  TEXT    NOT NULL,
    slot              TEXT    NOT NULL,
    chat_id           INTEGER NOT NULL,
    thread_id         INTEGER NOT NULL,
    leader_epoch      INTEGER NOT NULL,
    requested_at_ms   INTEGER NOT NULL
);

-- Admission ledger: leases exclude the retirement fence; at most one fence exists.
CREATE TABLE admission_leases (
    id              TEXT PRIMARY KEY,
    operation_id    TEXT    NOT NULL,
    operation_kind  TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    owner           TEXT    NOT NULL,
    acquired_at_ms  INTEGER NOT NULL
);
CREATE TABLE retirement_fence (
    id                    INTEGER PRIMARY KEY CHECK (id = 1),
    operation_id          TEXT    NOT NULL,
    retirement_intent_id  TEXT    NOT NULL,
    binding_key           TEXT    NOT NULL,
    slot                  TEXT    NOT NULL,
    chat_id               INTEGER NOT NULL,
    thread_id             INTEGER NOT NULL,
    leader_epoch          INTEGER NOT NULL,
    owner                 TEXT    NOT NULL,
    phase                 TEXT    NOT NULL CHECK (phase IN ('fenced', 'deletion-issued', 'commit-ready', 'deletion-rejected')),
    acquired_at_ms        INTEGER NOT NULL,
    deletion_issued_at_ms INTEGER,
    resolved_at_ms        INTEGER
);

-- Inbound journal: owner messages routed to a binding, kept until the follower's receipt.
CREATE TABLE inbound_journal (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    update_id       INTEGER NOT NULL UNIQUE,
    binding_key     TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at_ms   INTEGER NOT NULL,
    delivered_at_ms INTEGER
);
CREATE INDEX inbound_journal_pending ON inbound_journal (binding_key, seq) WHERE status = 'pending';

-- Outbox: follower output accepted by the leader, posted to Telegram in order per topic.
CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    binding_key   TEXT    NOT NULL,
    chat_id       INTEGER NOT NULL,
    thread_id     INTEGER,
    instance_id   TEXT    NOT NULL,
    request_id    TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('text', 'chatAction', 'document', 'notice')),
    payload       TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    created_at_ms INTEGER NOT NULL,
    sent_at_ms    INTEGER,
    UNIQUE (instance_id, request_id)
);
CREATE INDEX outbox_pending ON outbox (status, id) WHERE status = 'pending';
