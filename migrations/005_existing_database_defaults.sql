-- Defaults on upgrade: a database that a leader has already used keeps what it had.
--
-- * Its display mode. A mode chosen with /mode is stored under 'display_mode' and stays as it is.
--   Otherwise the mode came from the environment: TOPICBUS_DISPLAY_MODE when it was set (it still
--   applies, unchanged), else the old default, 'letters'. That old default is recorded here as this
--   database's own default, so a leader without TOPICBUS_DISPLAY_MODE keeps showing letters, while a
--   new database starts in 'names'. Storing 'display_mode' itself instead would override an
--   explicit TOPICBUS_DISPLAY_MODE and rename its topics.
-- * Its first start is long past: the first-start welcome is not posted to it.
--
-- "Used" means a leader has taken the lease or a binding exists; a new database has neither.
INSERT INTO runtime_settings (key, value, updated_at_ms)
SELECT 'display_mode_default', 'letters', CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE (EXISTS (SELECT 1 FROM leader_lease) OR EXISTS (SELECT 1 FROM workspace_bindings))
  AND NOT EXISTS (SELECT 1 FROM runtime_settings WHERE key = 'display_mode_default');

INSERT INTO runtime_settings (key, value, updated_at_ms)
SELECT 'welcomed', 'before-welcome', CAST(strftime('%s', 'now') AS INTEGER) * 1000
WHERE (EXISTS (SELECT 1 FROM leader_lease) OR EXISTS (SELECT 1 FROM workspace_bindings))
  AND NOT EXISTS (SELECT 1 FROM runtime_settings WHERE key = 'welcomed');
