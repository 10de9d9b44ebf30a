"""Is ``TOPICBUS_CHAT_ID`` a chat the bot can run topics in? Checked once at each leader start.

A wrong chat id, a bot that is not in the group, a group without Topics or a bot without the
right to manage topics cannot fix itself by retrying: the leader exits 2 with the fix (see
docs/operations.md, Troubleshooting). Anything Telegram does not answer clearly (network, flood
control, an unknown error) is not a verdict: the start goes on and meets it again later.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from telegram import ChatMemberAdministrator

from topicbus.core.telegram import CallOutcome, CallResult
from topicbus.bot.gateway import TelegramGateway

CHAT_VARIABLE = "TOPICBUS_CHAT_ID"
ADMIN_RIGHTS = "Manage Topics and Delete Messages"


@dataclass(frozen=True)
class ChatVerdict:
    """``fix`` is set when the chat cannot work as configured; ``note`` when the check was inconclusive."""

    fix: str | None = None
    note: str | None = None


def setup_fix(message: str, chat_id: int) -> str | None:
    """The fix for a Telegram refusal that only the operator can resolve, or None for anything else.

    ``message`` is Telegram's description as PTB reports it (any case, "Bad Request: " stripped)."""
    text = message.lower()
    if "chat not found" in text:
        if chat_id > 0:
            return (f"Telegram does not know chat {chat_id} for this bot. For topics in your private chat with "
                    f"the bot, open the bot in Telegram and press Start; for a forum group, {CHAT_VARIABLE} is "
                    "the group's id, which starts with -100 (README, Quick start, step 5)")
        return (f"Telegram does not know chat {chat_id} for this bot: add the bot to the forum group, and check "
                f"{CHAT_VARIABLE} (the group's id starts with -100; README, Quick start, step 5)")
    if any(marker in text for marker in ("bot was kicked", "bot is not a member", "user not found")):
        return (f"the bot is not a member of chat {chat_id} ({message}): add it to the group and make it an "
                f"admin with {ADMIN_RIGHTS}")
    if any(marker in text for marker in ("not enough rights", "chat_admin_required", "need administrator rights",
                                         "have no rights")):
        return (f"the bot may not manage topics in chat {chat_id} ({message}): make it an admin of the group "
                f"with {ADMIN_RIGHTS}")
    if "not a forum" in text or "chat_not_forum" in text:
        return f"chat {chat_id} has no topics: turn on Topics in the group's settings"
    if "bot_forum_create_forbidden" in text:
        return ("Telegram does not let the bot create topics in your private chat: enable topics for the bot's "
                "private chats in @BotFather, or use a forum group")
    return None


async def check_chat(gateway: TelegramGateway, chat_id: int, bot_id: int) -> ChatVerdict:
    """``getChat`` and, for a group, ``getChatMember`` for the bot itself. Both are asked at once
    (two reads, one round trip to Telegram before readiness instead of two); the member answer is
    looked at only when the chat is a forum group."""
    member_call = asyncio.create_task(gateway.get_chat_member(chat_id, bot_id), name="chat-check-member")
    try:
        verdict = await _verdict(await gateway.get_chat(chat_id), member_call, chat_id)
    except BaseException:
        member_call.cancel()
        await asyncio.gather(member_call, return_exceptions=True)
        raise
    await asyncio.gather(member_call, return_exceptions=True)  # never left running (in flight beside getChat)
    return verdict


async def _verdict(chat: CallResult, member_call: asyncio.Task[CallResult], chat_id: int) -> ChatVerdict:
    if not chat.ok:
        fix = setup_fix(chat.message, chat_id) if chat.outcome is CallOutcome.REJECTED else None
        return ChatVerdict(fix=fix, note=None if fix else f"getChat: {chat.outcome}: {chat.message}")
    kind, is_forum = getattr(chat.value, "type", None), bool(getattr(chat.value, "is_forum", False))
    if kind == "private":
        return ChatVerdict()  # topics in the owner's private chat: nothing more to check here
    if kind == "channel":
        return ChatVerdict(fix=f"chat {chat_id} is a channel; topicbus needs a group with Topics turned on")
    if kind == "group":
        return ChatVerdict(fix=(f"chat {chat_id} is a basic group: turn on Topics in its settings (it then becomes "
                                f"a supergroup with a new id starting with -100) and update {CHAT_VARIABLE}"))
    if not is_forum:
        return ChatVerdict(fix=f"chat {chat_id} has no topics: turn on Topics in the group's settings")
    member = await member_call
    if not member.ok:
        fix = setup_fix(member.message, chat_id) if member.outcome is CallOutcome.REJECTED else None
        return ChatVerdict(fix=fix, note=None if fix else f"getChatMember: {member.outcome}: {member.message}")
    if not isinstance(member.value, ChatMemberAdministrator):
        return ChatVerdict(fix=(f"the bot is not an admin of chat {chat_id}: promote it to admin with "
                                f"{ADMIN_RIGHTS}"))
    if member.value.can_manage_topics is False:
        return ChatVerdict(fix=(f"the bot is an admin of chat {chat_id} but may not manage topics: give it "
                                f"{ADMIN_RIGHTS}"))
    return ChatVerdict()
