"""Inline buttons end to end (docs/architecture.md, "A button press"): a real leader process against the fake Bot API,
real ``topicbus follow`` processes and a real ``FollowerClient`` program. A yes/no prompt gets Yes
and No buttons and a press types the answer; the Interrupt button interrupts a printing child and
ignores strangers; a ``FollowerClient`` sees a press exactly once across a leader SIGKILL; a storm of
presses, a stranger's or an owner's on an answered prompt, neither delays another agent's echo nor
gets more than a few answers."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import sqlite3
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, ECHO_AGENT, OWNER_ID, SECRET, Cluster, Proc
from tests.fakebotapi import SentMessage
from topicbus.leader.buttons import ALREADY, INTERRUPTED, SENT, STRANGER
from topicbus.leader.keyboards import INTERRUPT_LABEL

pytestmark = pytest.mark.e2e

STRANGER_ID = 31337
DEADLINE = 20.0  # the e2e budget is unlimited: these waits cover process starts on a busy machine

PROMPT_AGENT = textwrap.dedent("""
    print("agent ready", flush=True)
    answer = input("Continue? [y/N] ")
    print("answer=" + answer, flush=True)
    input()
""")

# Prints a line every 0.2 s until it gets SIGINT; then says so and exits.
TICKER = textwrap.dedent("""
    import signal, sys, time
    def interrupted(*_):
        print("interrupted", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGINT, interrupted)
    print("agent ready", flush=True)
    tick = 0
    while True:
        tick += 1
        print(f"tick {tick}", flush=True)
        time.sleep(0.2)
""")

LONG_DATA = "deploy:" + "x" * 200  # beyond Telegram's 64 bytes of callback data

# A FollowerClient program: asks with two buttons and records every press and message it gets.
PICKER = textwrap.dedent(f"""
    import asyncio, json, os
    from topicbus import Button, FollowerClient

    async def main():
        out = open(os.environ["PICKER_OUT"], "a", encoding="utf-8")

        def record(entry):
            out.write(json.dumps(entry) + "\\n")
            out.flush()

        async def on_button(press):
            record({{"button": press.data, "messageId": press.message_id, "deliveryId": press.delivery_id}})

        async def on_delivery(delivery):
            record({{"text": delivery.text}})

        client = FollowerClient(leader_url=os.environ["TOPICBUS_LEADER_URL"], secret=os.environ["TOPICBUS_BUS_SECRET"],
                                on_delivery=on_delivery, on_button=on_button, cwd=os.environ["PICKER_CWD"],
                                name="picker", heartbeat_interval_s=0.2)
        async with client:
            await client.wait_registered(timeout=30)
            await client.send_text("Deploy to production?",
                                   buttons=[[Button("Deploy", {LONG_DATA!r}), Button("Cancel", "cancel")]])
            await client.wait_failure()

    asyncio.run(main())
""")


def keyed(cluster: Cluster, thread: int, needle: str) -> SentMessage | None:
    """The bot's message in ``thread`` that contains ``needle`` and carries a keyboard."""
    return next((m for m in cluster.fake.messages_in(CHAT_ID, thread)
                 if m.reply_markup and needle in (m.text or "")), None)


def callbacks(message: SentMessage) -> dict[str, str]:
    assert message.reply_markup is not None
    return {b["text"]: b["callback_data"] for row in message.reply_markup["inline_keyboard"] for b in row}


def press(cluster: Cluster, message: SentMessage, label: str, data: str | None = None,
          from_id: int = OWNER_ID) -> dict[str, Any]:
    assert message.message_id is not None
    return cluster.fake.push_callback_query(CHAT_ID, message.message_id, data or callbacks(message)[label],
                                            from_id=from_id)


async def answer(cluster: Cluster, update: dict[str, Any]) -> tuple[str | None, bool]:
    found = await cluster.wait_for(lambda: cluster.fake.answers_to(update), DEADLINE, "the answer to a press")
    return found[0].text, found[0].show_alert


async def test_a_yes_no_prompt_gets_buttons_and_an_owners_press_types_the_answer(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = cluster.tmp / "prompt"
    await cluster.start_follower(work, script=PROMPT_AGENT)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    prompt = await cluster.wait_for(lambda: keyed(cluster, thread, "Continue? [y/N]"), DEADLINE,
                                    lambda: f"the prompt with buttons: {cluster.texts_in(thread)}")
    assert list(callbacks(prompt)) == ["Yes", "No"]
    assert all(len(data.encode()) <= 64 for data in callbacks(prompt).values())

    stranger = press(cluster, prompt, "Yes", from_id=STRANGER_ID)
    assert await answer(cluster, stranger) == (STRANGER, True)
    yes = press(cluster, prompt, "Yes")
    await cluster.wait_text(thread, "answer=y")
    assert await answer(cluster, yes) == (SENT.format(label="Yes"), False)
    await cluster.wait_for(lambda: prompt.reply_markup is None, DEADLINE, "the buttons removed")
    assert prompt.text is not None and prompt.text.endswith("Continue? [y/N]\n\n👉 Yes")
    assert "answer=n" not in "\n".join(cluster.texts_in(thread))


async def test_the_interrupt_button_interrupts_a_printing_child_and_ignores_strangers(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = cluster.tmp / "ticker"
    follower = await cluster.start_follower(work, script=TICKER)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    live = await cluster.wait_for(lambda: keyed(cluster, thread, "tick"), DEADLINE,
                                  lambda: f"output with the Interrupt button: {cluster.texts_in(thread)}")
    assert list(callbacks(live)) == [INTERRUPT_LABEL]
    data = callbacks(live)[INTERRUPT_LABEL]

    stranger = press(cluster, live, INTERRUPT_LABEL, data, from_id=STRANGER_ID)
    assert await answer(cluster, stranger) == (STRANGER, True)
    assert follower.process.returncode is None and "interrupted" not in "\n".join(cluster.texts_in(thread))

    owner = press(cluster, live, INTERRUPT_LABEL, data)
    assert await answer(cluster, owner) == (INTERRUPTED, False)
    await cluster.wait_text(thread, "interrupted")
    assert await follower.wait() == 0
    # Only the owner's press reached the child: follow was handed exactly one interrupt.
    assert follower.log().count("follow: control interrupt from the topic") == 1


def journaled_presses(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT COUNT(*) FROM inbound_journal WHERE json_extract(payload, '$.type') = 'button'"
                            ).fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def recorded(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        return []


async def test_a_follower_client_sees_a_press_exactly_once_across_a_leader_sigkill(cluster: Cluster):
    first = await cluster.start_leader()
    await cluster.wait_polling()
    out, work = cluster.tmp / "picker.jsonl", cluster.tmp / "picker"
    work.mkdir()
    picker = await cluster.spawn_python("picker", PICKER, PICKER_OUT=str(out), PICKER_CWD=str(work),
                                        TOPICBUS_BUS_SECRET=SECRET)
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    question = await cluster.wait_for(lambda: keyed(cluster, thread, "Deploy to production?"), DEADLINE,
                                      "the question with its buttons")
    keys = callbacks(question)

    # The owner presses Deploy. The leader journals the press and is killed before Telegram hears
    # that the update was handled (every getUpdates that would confirm it is cut), so the next
    # leader is handed the same update again.
    deploy = press(cluster, question, "Deploy")
    cluster.fake.drop_next("getUpdates", times=1_000_000,
                           when=lambda p: isinstance(p.get("offset"), int) and p["offset"] > deploy["update_id"])
    await cluster.wait_for(lambda: journaled_presses(cluster.db_path) == 1, DEADLINE, "the press journaled")
    first.kill(signal.SIGKILL)
    await first.wait()
    cluster.fake.clear_faults("getUpdates")

    second = await cluster.start_leader()
    await cluster.wait_polling()
    await cluster.wait_for(lambda: "by an owner: repeat" in second.log(), DEADLINE,
                           "the new leader handed the same press again")
    await cluster.wait_for(lambda: question.reply_markup is None, DEADLINE, "the choice shown")
    assert question.text == "Deploy to production?\n\n👉 Deploy"

    cancel = press(cluster, question, "Cancel", keys["Cancel"])  # a client that still shows the buttons
    assert await answer(cluster, cancel) == (ALREADY.format(label="Deploy"), True)
    # Deliveries keep journal order: once this message is in, any second press would be too.
    cluster.fake.push_message(CHAT_ID, "after", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_for(lambda: {"text": "after"} in recorded(out), DEADLINE,
                           lambda: f"the message after the press: {recorded(out)}")
    presses = [entry for entry in recorded(out) if "button" in entry]
    assert [(p["button"], p["messageId"]) for p in presses] == [(LONG_DATA, question.message_id)]
    assert journaled_presses(cluster.db_path) == 1
    await stop(picker)


async def stop(proc: Proc) -> None:
    proc.kill(signal.SIGTERM)
    try:
        await proc.wait(10)
    except (TimeoutError, asyncio.TimeoutError):
        proc.kill()


# --- storms of presses ---------------------------------------------------------------------------------

PRESSES = 500
BOT_RATE = 30  # Telegram's calls a second for one bot, as in production (the rest of the budget is unlimited)
# Answering every press at the bot's rate would hold output back this long (17 s); answered in its own
# bounded lane, the presses cost the echo only the time to read them. Half of it is the deadline.
STORM_S = PRESSES / BOT_RATE
ECHO_DEADLINE = STORM_S / 2


@dataclass
class Storm:
    """A prompt agent and an echo agent under one leader at the bot's real rate."""

    cluster: Cluster
    prompt: SentMessage
    prompt_thread: int
    echo_thread: int
    data: dict[str, str]  # the prompt's buttons: label -> callback data

    async def echo_s(self, text: str, deadline: float) -> float:
        """Seconds from an owner message in the echo agent's topic to the agent's answer there."""
        started = time.monotonic()
        self.cluster.fake.push_message(CHAT_ID, text, thread_id=self.echo_thread, from_id=OWNER_ID)
        await self.cluster.wait_text(self.echo_thread, f"echo: {text}", deadline)
        return time.monotonic() - started

    def press(self, times: int, *, from_id: int, label: str = "Yes") -> list[dict[str, Any]]:
        """``times`` presses of one button, pushed as fast as the fake takes them."""
        assert self.prompt.message_id is not None
        return [self.cluster.fake.push_callback_query(CHAT_ID, self.prompt.message_id, self.data[label],
                                                      from_id=from_id) for _ in range(times)]

    async def all_read(self) -> None:
        """Every update so far was handled (the leader confirmed them all)."""
        await self.cluster.wait_for(lambda: not self.cluster.fake.pending_updates(), DEADLINE, "the presses read")

    def answers(self, updates: list[dict[str, Any]]) -> list[Any]:
        return [a for u in updates for a in self.cluster.fake.answers_to(u)]


async def storm_setup(cluster: Cluster) -> Storm:
    await cluster.start_leader(TOPICBUS_RATE_LIMIT_PER_SECOND=str(BOT_RATE), TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    await cluster.start_follower(cluster.tmp / "prompt", script=PROMPT_AGENT)
    await cluster.start_follower(cluster.tmp / "echo", script=ECHO_AGENT)
    prompt_thread = (await cluster.wait_follower_topic(cluster.tmp / "prompt"))["threadId"]
    echo_thread = (await cluster.wait_follower_topic(cluster.tmp / "echo"))["threadId"]
    prompt = await cluster.wait_for(lambda: keyed(cluster, prompt_thread, "Continue? [y/N]"), DEADLINE,
                                    lambda: f"the prompt with buttons: {cluster.texts_in(prompt_thread)}")
    await cluster.wait_text(echo_thread, "agent ready")
    return Storm(cluster, prompt, prompt_thread, echo_thread, callbacks(prompt))


async def test_a_strangers_press_storm_gets_one_alert_and_does_not_delay_another_agents_echo(cluster: Cluster):
    storm = await storm_setup(cluster)
    await storm.echo_s("before", DEADLINE)

    presses = storm.press(PRESSES, from_id=STRANGER_ID)
    await storm.echo_s("during", ECHO_DEADLINE)  # behind all 500 presses in the update queue

    await storm.all_read()
    await cluster.wait_for(lambda: storm.answers(presses), DEADLINE, "the stranger's alert")
    answers = storm.answers(presses)
    assert [(a.text, a.show_alert) for a in answers] == [(STRANGER, True)]  # one alert a minute, nothing more
    assert len(cluster.fake.calls_to("answerCallbackQuery")) == 1
    # Nothing reached the agent, and its buttons still work for the owner, once.
    assert storm.prompt.reply_markup is not None and "answer=" not in "\n".join(cluster.texts_in(storm.prompt_thread))
    (owner,) = storm.press(1, from_id=OWNER_ID)
    await cluster.wait_text(storm.prompt_thread, "answer=y")
    assert await answer(cluster, owner) == (SENT.format(label="Yes"), False)


async def test_an_owners_press_storm_on_an_answered_prompt_does_not_delay_another_agents_echo(cluster: Cluster):
    storm = await storm_setup(cluster)
    (first,) = storm.press(1, from_id=OWNER_ID)
    await cluster.wait_text(storm.prompt_thread, "answer=y")
    assert await answer(cluster, first) == (SENT.format(label="Yes"), False)
    await cluster.wait_for(lambda: storm.prompt.reply_markup is None, DEADLINE, "the buttons removed")

    presses = storm.press(PRESSES, from_id=OWNER_ID)  # a client that still shows the buttons
    await storm.echo_s("during", ECHO_DEADLINE)

    await storm.all_read()
    await cluster.wait_for(lambda: storm.answers(presses), DEADLINE, "an answer to the storm")
    answers = storm.answers(presses)
    # Merged: one answer for the first press, then at most one a second for the latest (a burst read
    # in a few seconds gets a few); never one per press.
    assert answers and len(answers) <= PRESSES // 25
    assert {(a.text, a.show_alert) for a in answers} == {(ALREADY.format(label="Yes"), True)}
    # The press that counted reached the agent once; the storm typed nothing more.
    await storm.echo_s("after", DEADLINE)
    assert "\n".join(cluster.texts_in(storm.prompt_thread)).count("answer=") == 1


# --- a yes/no question with stderr around it -------------------------------------------------------------

# A warning on stderr, the question on stdout, and (in the Python script) a second warning a tenth of a
# second after the question (a library warning as the answer is awaited), before the answer is read. The shell script is the trial's: it writes both before
# follow's first read, so both pipes are read at once.
WARNS_THEN_ASKS = {
    "python": [sys.executable, "-c", textwrap.dedent("""
        import sys, time
        sys.stderr.write("warning: the config file is older than the code\\n"); sys.stderr.flush()
        sys.stdout.write("Deploy v1.4.2 to production? [y/N] "); sys.stdout.flush()
        time.sleep(0.1)
        sys.stderr.write("warning: 2 replicas are behind\\n"); sys.stderr.flush()
        answer = sys.stdin.readline().strip()
        print("deploying" if answer == "y" else "aborted", flush=True)
        sys.stdin.readline()
    """)],
    "sh": ["sh", "-c", 'echo "warning: the config file is older than the code" >&2; '
                       'printf "Deploy v1.4.2 to production? [y/N] "; read answer; '
                       'if [ "$answer" = y ]; then echo deploying; else echo aborted; fi; read rest'],
}


@pytest.mark.parametrize("program", sorted(WARNS_THEN_ASKS))
async def test_a_question_after_stderr_warnings_keeps_its_buttons_and_comes_after_them(cluster: Cluster,
                                                                                       program: str):
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = cluster.tmp / "deploy"
    work.mkdir()
    await cluster.spawn("follow-deploy", ["follow", "--cwd", str(work), "--", *WARNS_THEN_ASKS[program]])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    question = "Deploy v1.4.2 to production? [y/N]"
    await cluster.wait_for(lambda: question in cluster.lines_in(thread), DEADLINE,
                           lambda: f"the question: {cluster.texts_in(thread)}")
    lines = cluster.lines_in(thread)
    warning = "⚠ warning: the config file is older than the code"
    assert warning in lines and lines.index(warning) < lines.index(question), lines
    asking = keyed(cluster, thread, question)
    assert asking is not None, [(m.text, m.reply_markup) for m in cluster.fake.messages_in(CHAT_ID, thread)]
    assert list(callbacks(asking)) == ["Yes", "No"]
    yes = press(cluster, asking, "Yes")
    await cluster.wait_text(thread, "deploying")
    assert await answer(cluster, yes) == (SENT.format(label="Yes"), False)
    assert "aborted" not in "\n".join(cluster.texts_in(thread))


# --- no Interrupt button left once a run ended --------------------------------------------------------

# Prints a line every 0.25 s for about 7 s; then either waits for input ("stops") or exits.
RUN_THEN = textwrap.dedent("""
    import sys, time
    print("agent ready", flush=True)
    sys.stdin.readline()
    for step in range(28):
        print(f"step {step} " + "." * 60, flush=True)
        time.sleep(0.25)
    print("run over", flush=True)
    if sys.argv[1] == "stops":
        sys.stdin.readline()
""")


def interrupt_buttons_sent(cluster: Cluster) -> int:
    """Sends and edits that carried the Interrupt button so far."""
    return sum(1 for method in ("sendMessage", "editMessageText") for call in cluster.fake.calls_to(method)
               if INTERRUPT_LABEL in json.dumps(call.params.get("reply_markup") or "", ensure_ascii=False))


def still_interruptible(cluster: Cluster, thread: int) -> list[int | None]:
    return [m.message_id for m in cluster.fake.messages_in(CHAT_ID, thread)
            if m.reply_markup and INTERRUPT_LABEL in json.dumps(m.reply_markup, ensure_ascii=False)]


@pytest.mark.parametrize("end", ["stops", "exits"])
async def test_no_message_keeps_the_interrupt_button_once_a_run_ended(cluster: Cluster, end: str):
    # A live message grows for 3 s at most, so the run spreads over several messages.
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false", TOPICBUS_LIVE_MESSAGE_S="3")
    await cluster.wait_polling()
    work = cluster.tmp / "run"
    work.mkdir()
    await cluster.spawn("follow-run", ["follow", "--cwd", str(work), "--", sys.executable, "-u", "-c", RUN_THEN, end])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    cluster.fake.push_message(CHAT_ID, "go", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "run over", DEADLINE)
    if end == "exits":
        await cluster.wait_text(thread, "⏹ exited with code 0", DEADLINE)
    else:  # the stream's end: the one notifying line after it went quiet
        await cluster.wait_for(lambda: any(t.startswith("✓") for t in cluster.texts_in(thread)), DEADLINE,
                               lambda: f"the end of the stream: {cluster.texts_in(thread)}")
    assert interrupt_buttons_sent(cluster) >= 1, "the run's messages carried the Interrupt button while it printed"
    await cluster.wait_for(lambda: not still_interruptible(cluster, thread), DEADLINE,
                           lambda: f"no Interrupt button left: {still_interruptible(cluster, thread)}")
    assert len([m for m in cluster.fake.messages_in(CHAT_ID, thread) if (m.text or "").startswith("step")]) >= 2
