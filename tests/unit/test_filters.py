"""topicbus.handlers.filters: InThread reads its topic at filter time and composes with PTB's & | ~."""

from __future__ import annotations

from telegram import Update

from topicbus.handlers.filters import InThread, owner_messages

CHAT, OWNER = -1001, 42


def _update(thread_id: int | None, *, from_id: int = OWNER, topic: bool = True) -> Update:
    message = {"message_id": 1, "date": 0, "chat": {"id": CHAT, "type": "supergroup", "is_forum": True},
               "from": {"id": from_id, "is_bot": False, "first_name": "o"}, "text": "hi"}
    if thread_id is not None:
        message.update(message_thread_id=thread_id, is_topic_message=topic)
    return Update.de_json({"update_id": 1, "message": message}, None)


def test_in_thread_reads_the_thread_at_filter_time_and_inverts_with_tilde():
    current = {"id": 5}
    inside, outside = InThread(lambda: current["id"]), ~InThread(lambda: current["id"])
    assert inside.check_update(_update(5)) and not outside.check_update(_update(5))
    assert not inside.check_update(_update(6)) and outside.check_update(_update(6))
    assert not inside.check_update(_update(5, topic=False))  # a reply thread, not a forum topic
    assert not inside.check_update(_update(None)) and outside.check_update(_update(None))
    current["id"] = 6  # re-provisioned control topic
    assert inside.check_update(_update(6)) and not outside.check_update(_update(6))
    current["id"] = None  # no control topic yet
    assert not inside.check_update(_update(6)) and outside.check_update(_update(6))


def test_composed_with_owner_filter():
    composed = owner_messages(CHAT, frozenset({OWNER})) & ~InThread(lambda: 5)
    assert composed.check_update(_update(7))
    assert not composed.check_update(_update(5))
    assert not composed.check_update(_update(7, from_id=OWNER + 1))


def test_not_status_update_answers_as_ptbs_filter_for_each_update_even_with_the_same_id():
    from telegram.ext import filters

    from topicbus.handlers.filters import NOT_STATUS_UPDATE

    chat = {"id": CHAT, "type": "supergroup", "is_forum": True}
    sender = {"id": OWNER, "is_bot": False, "first_name": "o"}
    text = Update.de_json({"update_id": 7, "message": {"message_id": 1, "date": 0, "chat": chat, "from": sender,
                                                       "text": "hi"}}, None)
    created = Update.de_json({"update_id": 7, "message": {"message_id": 2, "date": 0, "chat": chat, "from": sender,
                                                          "forum_topic_created": {"name": "B",
                                                                                  "icon_color": 7322096}}}, None)
    for update in (text, text, created, created, text):  # the same update_id, other content: asked afresh
        assert NOT_STATUS_UPDATE.check_update(update) == (not filters.StatusUpdate.ALL.check_update(update))
    assert NOT_STATUS_UPDATE.check_update(text) and not NOT_STATUS_UPDATE.check_update(created)
