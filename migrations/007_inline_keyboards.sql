-- Inline keyboards the leader puts under messages (docs/architecture.md, "A button press"):
--   choice     a follower's own buttons; a press comes back to that follower process as a journaled
--              `button` delivery, once per message
--   interrupt  the Interrupt button under a printing agent's output; a press sends `interrupt` (a
--              `control`) to the registration generation that printed it
-- Telegram's callback_data holds at most 64 bytes, so a button carries only "k:<token>:<index>" and
-- the follower's data stays here. The token is random (96 bits) and a press is also checked against
-- the chat and the message it came from.
CREATE TABLE inline_keyboards (
    token                   TEXT    PRIMARY KEY,
    kind                    TEXT    NOT NULL CHECK (kind IN ('choice', 'interrupt')),
    outbox_id               INTEGER NOT NULL,  -- the output row whose message carries it
    binding_key             TEXT    NOT NULL,
    instance_id             TEXT    NOT NULL,  -- the follower process a press belongs to
    registration_generation TEXT    NOT NULL,  -- its registration when the keyboard was made
    takes_presses           INTEGER,           -- choice: the follower advertised button-v1 (NULL: unknown)
    chat_id                 INTEGER NOT NULL,
    thread_id               INTEGER,
    message_id              INTEGER,           -- once Telegram accepted the message
    buttons                 TEXT    NOT NULL,  -- JSON rows of {"text", "data"}
    created_at_ms           INTEGER NOT NULL,
    answered_update_id      INTEGER,           -- choice: the press that answered it (there is one)
    answered_index          INTEGER,
    answered_by             INTEGER,
    answered_at_ms          INTEGER,
    shown_text              TEXT,              -- JSON: the message as it is edited to show the choice
    shown_at_ms             INTEGER            -- when Telegram showed the choice (buttons removed)
);
CREATE UNIQUE INDEX inline_keyboards_outbox ON inline_keyboards (outbox_id, kind);
CREATE INDEX inline_keyboards_unshown ON inline_keyboards (answered_at_ms)
    WHERE answered_at_ms IS NOT NULL AND shown_at_ms IS NULL;

-- A generation-bound journal row (a button press) belongs to one follower process: it is delivered
-- to that instance only (also after it reconnects), and settled `skipped` when a successor holds the
-- binding. NULL: an owner message, delivered to whichever follower holds the binding.
ALTER TABLE inbound_journal ADD COLUMN for_instance TEXT;
