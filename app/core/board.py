"""The leader's view for operators: ``topicbus status``, ``/v1/status`` and the /status board."""

from __future__ import annotations

from typing import Any


def render_board(snapshot: dict[str, Any]) -> str:
    """A compact, readable board: one line per slot."""
    lines = [f"topicbus · {snapshot.get('role', '?')} · epoch {snapshot.get('epoch', '?')} · cleanup "
             f"{snapshot.get('cleanupPolicy', '?')} · mode {snapshot.get('displayMode', '?')}"]
    if snapshot.get("role") in ("standby", "starting", "stopping"):
        lines.append("(this process is not serving as leader right now; no live view)")
    for b in snapshot.get("bindings", []):
        age = b.get("heartbeatAgeMs")
        age_text = f"{age / 1000:.1f}s" if isinstance(age, int | float) else "—"
        lines.append(f"{b.get('slot') or '·'}  {b['title'][:40]:<40}  {b['state']:<9} hb {age_text:>6}  "
                     f"queued {b['queued']}")
    if not snapshot.get("bindings"):
        lines.append("(no bindings yet)")
    rotation = snapshot.get("rotation")
    if rotation:
        line = f"slots {rotation['slotsUsed']}/26 used"
        order = [r for r in rotation["rotationOrder"] if r["protection"] == "eligible"]
        if order:
            line += " · rotates next: " + ", ".join(r["slot"] for r in order[:5])
        lines.append(line)
        if rotation.get("fence"):
            fence = rotation["fence"]
            lines.append(f"retirement fence: slot {fence['slot']} thread {fence['threadId']} phase {fence['phase']}")
    pending = snapshot.get("pendingCleanups") or []
    if pending:
        lines.append(f"pending cleanups: {len(pending)}")
    observations = snapshot.get("pendingObservations") or []
    if observations:
        lines.append(f"awaiting death proof: {len(observations)}")
    return "\n".join(lines)


def render_text(snapshot: dict[str, Any]) -> str:
    """``topicbus status`` without ``--json``."""
    out = [render_board(snapshot), "", "followers:"]
    for f in snapshot.get("followers", []):
        out.append(f"  {f['slot'] or '·'}  {f['instanceId']}  pid {f['pid']}  thread {f['threadId']}  "
                   f"hb {f['heartbeatAgeMs'] / 1000:.1f}s ago  {f['workspace']}")
    if not snapshot.get("followers"):
        out.append("  (none)")
    return "\n".join(out)
