"""Building the python-telegram-bot ``Application`` for one leadership term.

PTB's ``Updater`` is not used (``updater(None)``): it confirms updates before the handlers have run,
so :class:`~topicbus.bot.poller.UpdatePoller` polls instead. The JobQueue (APScheduler) drives every
timer of the term. There is no ``AIORateLimiter``: the outbound scheduler (leader/outbound.py) is
the one spender of the chat's budget; a second limiter would count the same calls twice and hold a
call inside PTB instead of letting the scheduler serve another topic (docs/operations.md).
"""

from __future__ import annotations

import functools
import ssl

import httpx
from telegram.ext import Application, ApplicationBuilder
from telegram.request import HTTPXRequest

from topicbus.settings import Settings


class ApplicationUnavailable(Exception):
    """python-telegram-bot was installed without an extra topicbus needs."""


@functools.cache
def telegram_tls_context() -> ssl.SSLContext:
    """The one TLS context of every connection to the Bot API in this process: the one httpx would
    build (certifi, or SSL_CERT_FILE / SSL_CERT_DIR). Loading the CA bundle costs 20-45 ms of CPU,
    so it is built once and shared: PTB's two HTTP clients and the gateway's file downloads."""
    return httpx.create_ssl_context()


def build_application(settings: Settings) -> Application:
    assert settings.bot_token is not None
    base = settings.api_base_url
    # PTB builds two HTTP clients (one for getUpdates, one for every other call), and httpx loads the
    # CA bundle for each (20-45 ms of CPU apiece, on the way to readiness). They share one TLS context.
    tls = telegram_tls_context()
    calls = HTTPXRequest(connection_pool_size=256, connect_timeout=10, read_timeout=15, write_timeout=30,
                         pool_timeout=5, httpx_kwargs={"verify": tls})
    updates = HTTPXRequest(connection_pool_size=1, httpx_kwargs={"verify": tls})
    app = (ApplicationBuilder().token(settings.bot_token.get_secret_value()).base_url(base)
           .base_file_url(base.replace("/bot", "/file/bot", 1)).updater(None)
           .request(calls).get_updates_request(updates)
           .build())
    if app.job_queue is None:
        raise ApplicationUnavailable("python-telegram-bot was installed without the job-queue extra")
    return app
