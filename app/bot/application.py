"""Building the python-telegram-bot ``Application`` for one leadership term.

PTB's ``Updater`` is not used (``updater(None)``): it confirms updates before the handlers have run,
so :class:`~topicbus.bot.poller.UpdatePoller` polls instead. The JobQueue (APScheduler) drives every
timer of the term.
"""

from __future__ import annotations

from telegram.ext import AIORateLimiter, Application, ApplicationBuilder

from topicbus.settings import Settings


class ApplicationUnavailable(Exception):
    """python-telegram-bot was installed without an extra topicbus needs."""


def build_application(settings: Settings) -> Application:
    assert settings.bot_token is not None
    base = settings.api_base_url
    app = (ApplicationBuilder().token(settings.bot_token.get_secret_value()).base_url(base)
           .base_file_url(base.replace("/bot", "/file/bot", 1)).updater(None)
           .rate_limiter(AIORateLimiter(overall_max_rate=settings.rate_limit_per_second,
                                        group_max_rate=settings.rate_limit_per_chat_per_minute, max_retries=0))
           .connect_timeout(10).read_timeout(15).write_timeout(30).pool_timeout(5)
           .build())
    if app.job_queue is None:
        raise ApplicationUnavailable("python-telegram-bot was installed without the job-queue extra")
    return app
