-- Placeholder on the wip-citizen branch only: the number 003 belongs to the outbound scheduler's
-- outbox migration (issue 11). The runner refuses gaps, so this empty step keeps 004 reachable.
-- Drop this file when merging; the real 003 takes its place.
SELECT 1;
