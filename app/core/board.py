"""The leader's view for operators as text: the /status board (fits a phone) and ``topicbus status``."""

from __future__ import annotations

from typing import Any

WIDTH = 36  # a phone shows about this many monospace characters in a row


def _age(ms: object) -> str:
    if not isinstance(ms, int | float):
        return ""
    seconds = ms / 1000
    return f"{seconds:.0f}s" if seconds < 100 else f"{seconds / 60:.0f}m" if seconds < 6000 else f"{seconds / 3600:.0f}h"


def _chars(units: int) -> str:
    return f"{units}" if units < 1000 else f"{units / 1000:.1f}k"


def render_board(snapshot: dict[str, Any]) -> str:
    """The /status board: one row per slot, no row wider than :data:`WIDTH`, deleted bindings left out.
    Sent in monospace, so the columns line up."""
    lines = [f"topicbus · {snapshot.get('role', '?')} · epoch {snapshot.get('epoch', '?')}"[:WIDTH],
             f"cleanup {snapshot.get('cleanupPolicy', '?')} · {snapshot.get('displayMode', '?')}"[:WIDTH]]
    budget = snapshot.get("budget")
    if budget:
        line = f"budget {budget['usedLastMinute']}/{budget['perMinute'] or '∞'} a min"
        if budget.get("pausedForS"):
            line += f" · wait {budget['pausedForS']:.0f}s"
        lines.append(line[:WIDTH])
    if snapshot.get("role") in ("standby", "starting", "stopping"):
        lines.append("(not leading now: no live view)")
    shown = [b for b in snapshot.get("bindings", []) if b.get("state") != "deleted"]
    for b in shown:
        state = {"control": "", "live": "live", "offline": "offline", "preserved": "kept",
                 "detached": "detached"}.get(b["state"], b["state"])
        lines.append(f"{b.get('slot') or '·'} {b['title'][:17]:<17} {state:<8} {_age(b.get('heartbeatAgeMs')):>4}"
                     .rstrip()[:WIDTH])
        waiting = []
        if b.get("outboxItems"):
            waiting.append(f"out {b['outboxItems']} ({_chars(b.get('outboxUnits', 0))} ch)")
        if b.get("queued"):
            waiting.append(f"in {b['queued']}")
        if waiting:
            lines.append(("  " + " · ".join(waiting))[:WIDTH])
    if not shown:
        lines.append("(no topics yet)")
    rotation = snapshot.get("rotation")
    if rotation:
        line = f"slots {rotation['slotsUsed']}/26"
        order = [r for r in rotation["rotationOrder"] if r["protection"] == "eligible"]
        if order:
            line += " · next " + ",".join(r["slot"] for r in order[:5])
        lines.append(line[:WIDTH])
        if rotation.get("fence"):
            fence = rotation["fence"]
            lines.append(f"retiring {fence['slot']}: {fence['phase']}"[:WIDTH])
    pending = snapshot.get("pendingCleanups") or []
    if pending:
        lines.append(f"pending cleanups: {len(pending)}")
    observations = snapshot.get("pendingObservations") or []
    if observations:
        lines.append(f"awaiting death proof: {len(observations)}")
    return "\n".join(lines)


def render_text(snapshot: dict[str, Any]) -> str:
    """``topicbus status`` without ``--json``: the board, then the followers in full."""
    out = [render_board(snapshot), "", "followers:"]
    for f in snapshot.get("followers", []):
        out.append(f"  {f['slot'] or '·'}  {f['instanceId']}  pid {f['pid']}  thread {f['threadId']}  "
                   f"hb {f['heartbeatAgeMs'] / 1000:.1f}s ago  {f['workspace']}")
    if not snapshot.get("followers"):
        out.append("  (none)")
    deleted = [b for b in snapshot.get("bindings", []) if b.get("state") == "deleted"]
    if deleted:
        out += ["", "deleted topics (slot kept for the workspace): " + ", ".join(b.get("slot") or "·" for b in deleted)]
    return "\n".join(out)
