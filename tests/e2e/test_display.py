"""Topic titles end to end: no repaint storm at restart, one edit per topic for a burst."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.e2e.harness import CHAT_ID, Cluster

pytestmark = pytest.mark.e2e


def metric(cluster: Cluster, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return -1.0


def edits(cluster: Cluster) -> list:
    return [c for c in cluster.fake.calls_to("editForumTopic") if c.status == 200]


async def live_titles(cluster: Cluster) -> dict[int, str]:
    return {t.thread_id: t.name for t in cluster.fake.topics(CHAT_ID) if not t.deleted}


async def test_restart_makes_no_edits_while_followers_return(cluster: Cluster, tmp_path):
    window = {"TOPICBUS_DISPLAY_MODE": "directory-title", "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "6000"}
    leader = await cluster.start_leader(**window)
    await cluster.wait_polling()
    shared = tmp_path / "extensions"
    for name in ("one", "two"):
        await cluster.start_follower(shared, name=name, **window)
    await cluster.start_follower(tmp_path / "tools", **window)

    async def settled():
        snap = await cluster.status()
        live = [b for b in snap["bindings"] if b["state"] == "live"] if snap else []
        titles = await live_titles(cluster)
        return len(live) == 3 and sorted(titles[b["threadId"]] for b in live) == sorted(
            ["Extensions " + b["slot"] for b in live if b["cwd"] == str(shared)] + ["Tools"])

    await cluster.wait_for(settled, message="three live followers with settled titles")
    leader.kill(signal.SIGKILL)
    await leader.wait()
    cluster.fake.reset_calls()

    await cluster.start_leader(**window)
    await cluster.wait_polling()
    await cluster.wait_for(settled, timeout=20, message="followers back after the restart")
    assert edits(cluster) == []  # inside the 6 s window: nothing repainted
    # the deferred pass runs once at the end of the window and finds every title right
    await cluster.wait_for(lambda: metric(cluster, "topicbus_display_passes_total") >= 1, timeout=20,
                           message="the deferred startup display pass")
    assert edits(cluster) == []
    assert metric(cluster, "topicbus_display_passes_total") == 1


async def test_burst_of_ten_registrations_edits_each_topic_at_most_once(cluster: Cluster, tmp_path):
    mode = {"TOPICBUS_DISPLAY_MODE": "directory-title"}
    await cluster.start_leader(**mode)
    await cluster.wait_polling()
    burst = tmp_path / "burst"
    await asyncio.gather(*(cluster.start_follower(burst, name=f"agent{i}", **mode) for i in range(10)))

    async def all_titled():
        snap = await cluster.status()
        live = [b for b in snap["bindings"] if b["state"] == "live"] if snap else []
        titles = await live_titles(cluster)
        return len(live) == 10 and all(titles.get(b["threadId"]) == f"Burst {b['slot']}" for b in live)

    await cluster.wait_for(all_titled, timeout=40, message="ten followers titled 'Burst <slot>'")
    per_topic: dict[int, int] = {}
    for call in edits(cluster):
        per_topic[call.params["message_thread_id"]] = per_topic.get(call.params["message_thread_id"], 0) + 1
    assert all(count == 1 for count in per_topic.values()), per_topic
    assert len(per_topic) <= 10
