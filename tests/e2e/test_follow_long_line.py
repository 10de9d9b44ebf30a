"""One very long line flows through `follow` whole, in bounded memory.

A child writes a 6 MB line without a newline while the leader is reachable. Every character reaches
the topic (as messages and text documents), no "dropped" marker appears, and `follow`'s peak RSS
(``VmHWM`` from ``/proc/<pid>/status``) stays far below what holding the line would cost.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster

pytestmark = pytest.mark.e2e

LINE_BYTES = 6 * 1024 * 1024
#: What `follow` may add to its peak RSS while the line passes. Holding the line costs at least its
#: size as a str, and cleaning it as one piece (a list of its characters) eight bytes a character:
#: well over 50 MB for 6 MB. Reading it in bounded pieces costs a few hundred KiB of buffers.
RSS_GROWTH_LIMIT_KB = 2 * LINE_BYTES // 1024

def long_line_agent(line_bytes: int) -> str:
    """An agent that writes a line of ``line_bytes`` hex digits (no newline) in 64 KiB writes on
    "go", then a newline and "line written in S s" (S: how long its writes took); it exits on "bye".
    On "go and exit" it exits right after the line, without a newline."""
    return textwrap.dedent(f"""
        import hashlib, sys, time
        print("agent ready", flush=True)
        for command in sys.stdin:
            if command.strip() in ("go", "go and exit"):
                started = time.monotonic()
                total = 0
                n = 0
                while total < {line_bytes}:
                    piece = hashlib.sha256(str(n).encode()).hexdigest() * 1024  # 64 KiB
                    piece = piece[: {line_bytes} - total]
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                    total += len(piece)
                    n += 1
                if command.strip() == "go and exit":
                    sys.exit(0)
                sys.stdout.write(f"\\nline written in {{time.monotonic() - started:.2f}} s\\n")
                sys.stdout.flush()
            elif command.strip() == "bye":
                sys.exit(0)
    """)


LONG_LINE_AGENT = long_line_agent(LINE_BYTES)


def posted_between(lines: list[str], first: str, last_prefix: str) -> str:
    """The characters posted after the line ``first`` and before the first line starting with
    ``last_prefix``. Posts of a long line are cut where its batches were cut, and the leader joins
    them with newlines: joined without them, the characters in order are the line."""
    start = lines.index(first) + 1
    end = next(i for i, line in enumerate(lines) if i >= start and line.startswith(last_prefix))
    return "".join(lines[start:end])


def expected_line(line_bytes: int = LINE_BYTES) -> str:
    """The line :func:`long_line_agent` writes."""
    pieces = []
    total = n = 0
    while total < line_bytes:
        piece = (hashlib.sha256(str(n).encode()).hexdigest() * 1024)[: line_bytes - total]
        pieces.append(piece)
        total += len(piece)
        n += 1
    return "".join(pieces)


def peak_rss_kb(pid: int) -> int:
    """``VmHWM`` (peak resident set, KiB) of a live process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


async def test_a_6_mb_line_without_newline_arrives_whole_in_bounded_memory(cluster: Cluster, tmp_path: Path):
    await cluster.start_leader()
    await cluster.wait_polling()
    work = tmp_path / "long"
    follower = await cluster.start_follower(work, script=LONG_LINE_AGENT)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    idle_kb = peak_rss_kb(follower.pid)

    cluster.fake.push_message(CHAT_ID, "go", thread_id=thread, from_id=OWNER_ID)
    # Deadline: 6 MB through the bus and out as text documents; minutes of margin on a loaded box.
    await cluster.wait_for(lambda: any(line.startswith("line written") for line in cluster.lines_in(thread)),
                           timeout=240, message="the line and the line after it posted")
    grown_kb = peak_rss_kb(follower.pid) - idle_kb

    lines = cluster.lines_in(thread)
    assert not any("dropped" in line for line in lines), [line[:120] for line in lines if "dropped" in line]
    posted = posted_between(lines, "agent ready", "line written")
    line = expected_line()
    assert len(posted) == len(line)
    assert hashlib.sha256(posted.encode()).hexdigest() == hashlib.sha256(line.encode()).hexdigest()
    assert grown_kb < RSS_GROWTH_LIMIT_KB, f"follow's peak RSS grew by {grown_kb} KiB (idle peak {idle_kb} KiB)"

    cluster.fake.push_message(CHAT_ID, "bye", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait(timeout=60) == 0


async def test_a_6_mb_line_written_just_before_exit_arrives_whole_before_the_exit_notice(cluster: Cluster,
                                                                                       tmp_path: Path):
    """The child ends without a newline: its last piece is still in the pipe when it exits (reading
    may be held for backpressure then), and all of it is handed over before the exit notice."""
    await cluster.start_leader()
    await cluster.wait_polling()
    work = tmp_path / "long-exit"
    follower = await cluster.start_follower(work, script=LONG_LINE_AGENT)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")

    cluster.fake.push_message(CHAT_ID, "go and exit", thread_id=thread, from_id=OWNER_ID)
    assert await follower.wait(timeout=240) == 0
    await cluster.wait_for(lambda: any(line.startswith("⏹ exited with code 0") for line in cluster.lines_in(thread)),
                           timeout=60, message="the exit notice")
    lines = cluster.lines_in(thread)
    assert not any("dropped" in line for line in lines), [line[:120] for line in lines if "dropped" in line]
    posted = posted_between(lines, "agent ready", "⏹ exited with code 0")
    line = expected_line()
    assert len(posted) == len(line)
    assert hashlib.sha256(posted.encode()).hexdigest() == hashlib.sha256(line.encode()).hexdigest()
