"""The transcription endpoint's client: one ``multipart/form-data`` POST to
``<base>/v1/audio/transcriptions`` (the OpenAI audio API, which faster-whisper servers such as
speaches also serve) with ``file``, ``model``, ``response_format=json`` and optionally ``language``,
and the key, when there is one, as a Bearer token. The answer is ``{"text": …}``.

aiohttp, as for the bus: the leader already runs it (the bus server, the follower client), it builds
multipart bodies (``FormData``) and bounds a request with one ``ClientTimeout``; PTB's httpx client is
Telegram's and not ours to share.

Failures come back as :class:`TranscriptionFailed` with a short reason that never holds the key, the
audio or the endpoint's answer beyond its status code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
MAX_ANSWER_BYTES = 1024 * 1024  # a transcript of 300 s of speech is a few KB


class TranscriptionFailed(Exception):
    """The endpoint did not give a transcript; ``str(exc)`` is a short reason fit for a log line."""


@dataclass(frozen=True)
class TranscriptionEndpoint:
    """Where and how to transcribe. ``key`` is never part of the repr."""

    base_url: str
    model: str = "whisper-1"
    language: str | None = None
    key: str | None = None

    def __repr__(self) -> str:
        return (f"TranscriptionEndpoint(base_url={self.base_url!r}, model={self.model!r}, "
                f"language={self.language!r}, key={'set' if self.key else 'none'})")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + TRANSCRIPTIONS_PATH

    @property
    def host(self) -> str:
        """The endpoint's host (and port), as named to the owner: where the audio goes."""
        return urlsplit(self.base_url).netloc.rsplit("@", 1)[-1] or self.base_url


class TranscriptionClient:
    """One aiohttp session for the leader's life; :meth:`transcribe` is safe to call concurrently."""

    def __init__(self, endpoint: TranscriptionEndpoint):
        self.endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    async def transcribe(self, audio: bytes, *, file_name: str, mime_type: str | None, timeout_s: float) -> str:
        """The text the endpoint heard in ``audio``; raises :class:`TranscriptionFailed` (a timeout
        included: ``asyncio.TimeoutError`` is turned into one)."""
        form = aiohttp.FormData()
        form.add_field("file", audio, filename=file_name, content_type=mime_type or "application/octet-stream")
        form.add_field("model", self.endpoint.model)
        form.add_field("response_format", "json")
        if self.endpoint.language:
            form.add_field("language", self.endpoint.language)
        headers = {"Authorization": f"Bearer {self.endpoint.key}"} if self.endpoint.key else {}
        try:
            async with self._client().post(self.endpoint.url, data=form, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=timeout_s),
                                           allow_redirects=False) as response:
                if response.status != 200:
                    raise TranscriptionFailed(f"the endpoint answered HTTP {response.status}")
                body = await response.content.read(MAX_ANSWER_BYTES + 1)
        except TimeoutError:
            raise TranscriptionFailed(f"no answer within {timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise TranscriptionFailed(f"the endpoint could not be reached ({type(exc).__name__})") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise TranscriptionFailed("the endpoint's answer is too long")
        return _text_of(body)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _text_of(body: bytes) -> str:
    try:
        answer: Any = json.loads(body)
    except ValueError:
        raise TranscriptionFailed("the endpoint's answer is not JSON") from None
    text = answer.get("text") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        raise TranscriptionFailed("the endpoint's answer has no text")
    return text
