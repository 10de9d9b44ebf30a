"""The leader's view for operators as text: the /status board (fits a phone) and ``topicbus status``."""

from __future__ import annotations

from topicbus.core.status import StatusReport

WIDTH = 36  # a phone shows about this many monospace characters in a row


def _age(ms: float | None) -> str:
    if ms is None:
        return ""
    seconds = ms / 1000
    return f"{seconds:.0f}s" if seconds < 100 else f"{seconds / 60:.0f}m" if seconds < 6000 else f"{seconds / 3600:.0f}h"


def _chars(units: int) -> str:
    return f"{units}" if units < 1000 else f"{units / 1000:.1f}k"


def render_board(report: StatusReport) -> str:
    """The /status board: one row per slot, no row wider than :data:`WIDTH`, deleted bindings left out.
    Sent in monospace, so the columns line up."""
    term = report.term
    lines = [f"topicbus · {report.role} · epoch {report.epoch}"[:WIDTH],
             f"cleanup {term.cleanup_policy if term else '?'} · {term.display_mode if term else '?'}"[:WIDTH]]
    budget = term.budget if term else None
    if budget:
        per_minute = budget.per_minute
        line = f"budget {budget.used_last_minute}/{f'{per_minute:g}' if per_minute else '∞'} a min"
        if budget.paused_for_s:
            line += f" · wait {budget.paused_for_s:.0f}s"
        lines.append(line[:WIDTH])
    if report.role in ("standby", "starting", "stopping"):
        lines.append("(not leading now: no live view)")
    shown = [b for b in report.bindings if b.state != "deleted"]
    for b in shown:
        state = {"control": "", "live": "live", "offline": "offline", "preserved": "kept",
                 "detached": "detached", "ending": "ends in"}.get(b.state, b.state)
        # The last column: a live agent's heartbeat age, or how long an ended agent's topic stays.
        age = _age(b.deletes_in_ms if b.state == "ending" else b.heartbeat_age_ms)
        lines.append(f"{b.slot or '·'} {b.title[:17]:<17} {state:<8} {age:>4}".rstrip()[:WIDTH])
        waiting = []
        if b.outbox_items:
            waiting.append(f"out {b.outbox_items} ({_chars(b.outbox_units)} ch)")
        if b.queued:
            waiting.append(f"in {b.queued}")
        if waiting:
            lines.append(("  " + " · ".join(waiting))[:WIDTH])
    if not shown:
        lines.append("(no topics yet)")
    rotation = term.rotation if term else None
    if rotation:
        line = f"slots {rotation.slots_used}/26"
        order = [r for r in rotation.rotation_order if r.protection == "eligible"]
        if order:
            line += " · next " + ",".join(r.slot for r in order[:5])
        lines.append(line[:WIDTH])
        if rotation.fence:
            fence = rotation.fence
            lines.append(f"retiring {fence.slot}: {fence.phase}"[:WIDTH])
    if term and term.pending_cleanups:
        lines.append(f"pending cleanups: {len(term.pending_cleanups)}")
    if term and term.pending_observations:
        lines.append(f"awaiting death proof: {len(term.pending_observations)}")
    return "\n".join(lines)


def render_text(report: StatusReport) -> str:
    """``topicbus status`` without ``--json``: the board, then the followers in full."""
    out = [render_board(report), "", "followers:"]
    for f in report.followers:
        out.append(f"  {f.slot or '·'}  {f.instance_id}  pid {f.pid}  thread {f.thread_id}  "
                   f"hb {f.heartbeat_age_ms / 1000:.1f}s ago  {f.workspace}")
    if not report.followers:
        out.append("  (none)")
    deleted = [b for b in report.bindings if b.state == "deleted"]
    if deleted:
        out += ["", "deleted topics (slot kept for the workspace): " + ", ".join(b.slot or "·" for b in deleted)]
    return "\n".join(out)
