"""Positive proof that a ``FollowerClient`` has stopped for good, from its named asyncio tasks.

"It did not reconnect" cannot be proven by sleeping a while. It is proven once the client's
connection loop (task ``follower-connection:<instanceId>``) has returned: nothing is left that
could connect, register or heartbeat again. The client names its tasks; these helpers read them
through ``asyncio.all_tasks()`` rather than the client's private attributes.
"""

from __future__ import annotations

import asyncio
from typing import Any


def live_task_names(client: Any) -> set[str]:
    """Names of the client's tasks that have not finished (``follower-<role>:<instanceId>``)."""
    suffix = f":{client.instance_id}"
    return {name for task in asyncio.all_tasks() if (name := task.get_name()).startswith("follower-")
            and name.endswith(suffix)}


def connection_loop_ended(client: Any) -> bool:
    """True once the connection loop has returned while the client is still open (not closed).

    The delivery worker runs until ``close()``: its presence shows the task names are still the
    ones this helper knows, so a rename cannot make the check pass vacuously."""
    names = live_task_names(client)
    assert f"follower-deliveries:{client.instance_id}" in names, f"unexpected follower tasks: {names}"
    return f"follower-connection:{client.instance_id}" not in names


def closed_for_good(client: Any, leader: Any) -> bool:
    """True once none of the client's tasks is left and the leader has seen every socket close
    (so every frame the client sent before closing has been read)."""
    return not live_task_names(client) and all(conn.ws.closed for conn in leader.connections)
