-- Cleanups that wait for their grace period (TOPICBUS_CLEANUP_GRACE_S; docs/operations.md, "Cleanup policy"): a finished
-- agent's topic stays readable for a while before it is deleted. One row per binding (a later
-- departure of the same workspace replaces it). This is not yet destructive intent: when the row
-- falls due, the leader checks that nobody took the workspace back, that the topic's output went
-- out, and only then writes a pending_cleanups intent and closes and deletes the topic.
CREATE TABLE scheduled_cleanups (
    binding_key             TEXT PRIMARY KEY,
    instance_id             TEXT    NOT NULL,
    registration_generation TEXT    NOT NULL,
    chat_id                 INTEGER NOT NULL,
    thread_id               INTEGER NOT NULL,
    reason                  TEXT    NOT NULL,
    requested_at_ms         INTEGER NOT NULL,
    due_at_ms               INTEGER NOT NULL
);
