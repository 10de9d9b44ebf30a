"""What a follower's text format becomes at the Telegram call: Markdown as entities,
monospace (follow's default) as one `pre` entity, HTML as parse_mode, and HTML Telegram cannot parse
sent again once as the plain source. A leader with its real outbound scheduler and the fake Bot API."""

from __future__ import annotations

from topicbus.protocol import SendRequest, decode_frame, encode, send_frame, text_message
from tests.integration.leader_env import CHAT, LeaderEnv


async def _send(env: LeaderEnv, text: str, fmt: str, request: str) -> None:
    assert env.services is not None
    frame = send_frame(request, "a", "g1", {**text_message(text), "format": fmt})
    model = decode_frame(encode(frame))
    assert isinstance(model, SendRequest)
    await env.services.followers.send(model)


def outputs(env: LeaderEnv, thread: int) -> list:
    """The topic's messages without the one-line "✓ …" that ends a silent stream."""
    return [m for m in env.fake.messages_in(CHAT, thread) if not (m.text or "").startswith("✓")]


async def test_each_format_reaches_telegram_as_entities_or_parse_mode_and_bad_html_as_plain_text(env: LeaderEnv):
    await env.start()
    thread = (await env.register("a", cwd="/fmt", generation="g1", pid=10))["threadId"]
    cases = [("**done**: see `report.txt`", "markdown"), ("$ make\nok", "pre"), ("<b>bold</b> move", "html"),
             ("<b>unclosed", "html")]
    for index, (text, fmt) in enumerate(cases):
        await _send(env, text, fmt, f"r{index}")
        # one at a time: each is a message of its own (a format change never joins a live message)
        await env.fake.wait_for(lambda n=index: len(outputs(env, thread)) == n + 1, timeout=10)
    markdown, pre, html, broken = outputs(env, thread)

    assert markdown.text == "done: see report.txt"
    assert sorted(e["type"] for e in markdown.entities) == ["bold", "code"]
    assert pre.text == "$ make\nok" and [e["type"] for e in pre.entities] == ["pre"]
    assert pre.entities[0]["offset"] == 0 and pre.entities[0]["length"] == len("$ make\nok")
    assert (html.text, html.parse_mode) == ("<b>bold</b> move", "HTML")
    assert (broken.text, broken.parse_mode, broken.entities) == ("<b>unclosed", None, [])
    refused = [c for c in env.calls("sendMessage") + env.calls("editMessageText") if c.status == 400]
    assert refused and all(c.params.get("parse_mode") == "HTML" for c in refused)  # only as HTML; then plain
    assert [c.status for c in env.calls("sendMessage") if "unclosed" in str(c.params.get("text"))][-1] == 200
