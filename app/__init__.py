"""topicbus: one Telegram bot, many live agent processes, one forum topic each."""

__version__ = "0.1.0"
