"""A fake OpenAI-compatible transcription endpoint, and the ``transcriber`` fixture.

``FakeTranscriber`` is an aiohttp server on ``127.0.0.1`` (a free port) in the test's event loop,
serving ``POST /v1/audio/transcriptions`` as OpenAI does: ``multipart/form-data`` with a ``file``
part (with a file name), ``model`` and optionally ``language`` and ``response_format``, the key as
``Authorization: Bearer …``; the answer is ``{"text": …}``.

It checks what the leader sends: a request without a file, with another model than
:attr:`FakeTranscriber.model`, or without the right key (when :attr:`FakeTranscriber.key` is set)
is refused (400 or 401, as OpenAI) and the reason kept in :attr:`refused`. Accepted requests are kept
in :attr:`requests`. What it answers, request by request: :meth:`answer` (the text of the next
answers), :meth:`fail_next` (an HTTP error, by default 500, whose body repeats the request's
``Authorization`` header, as a careless server might), :meth:`hold_next` (no answer until the test
calls :meth:`release` or the fixture ends: a slow endpoint, or one a leader dies waiting on).
:attr:`decide`, when set, chooses instead for every request (``"text"``, ``"fail"`` or ``"hold"``), and
:attr:`echo` answers ``heard <the audio's bytes>`` (so a test knows which note a transcript is of).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web

PATH = "/v1/audio/transcriptions"
DEFAULT_TEXT = "hello from the fake transcriber"


@dataclass(frozen=True)
class TranscriptionRequest:
    model: str
    language: str | None
    response_format: str | None
    file_name: str
    content_type: str | None
    audio: bytes
    authorization: str | None


class FakeTranscriber:
    def __init__(self, *, key: str | None = None, model: str = "whisper-1"):
        self.key = key
        self.model = model
        self.requests: list[TranscriptionRequest] = []
        self.refused: list[str] = []
        self.held = 0  # requests waiting for release() right now
        self.decide: Callable[[TranscriptionRequest], str] | None = None
        self.echo = False
        self._plan: deque[tuple[str, object]] = deque()  # ("text", str) | ("fail", status) | ("hold", None)
        self._texts: deque[str] = deque()
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what it answers ---------------------------------------------------------------------------
    def answer(self, *texts: str) -> None:
        """The texts of the next successful answers, in order (then :data:`DEFAULT_TEXT`)."""
        self._texts.extend(texts)

    def fail_next(self, status: int = 500, times: int = 1) -> None:
        self._plan.extend([("fail", status)] * times)

    def hold_next(self, times: int = 1) -> None:
        """The next ``times`` requests get no answer until :meth:`release` (or the fixture's end)."""
        self._released.clear()
        self._plan.extend([("hold", None)] * times)

    def release(self) -> None:
        self._released.set()

    # --- the server --------------------------------------------------------------------------------
    async def start(self) -> FakeTranscriber:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post(PATH, self._transcribe)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        return self

    async def close(self) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _transcribe(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization")
        if self.key is not None and authorization != f"Bearer {self.key}":
            self.refused.append("wrong or missing key")
            return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
        if not request.content_type.startswith("multipart/form-data"):
            self.refused.append(f"not multipart: {request.content_type}")
            return web.json_response({"error": {"message": "multipart/form-data expected"}}, status=400)
        fields: dict[str, str] = {}
        file_name, file_type, audio = None, None, None
        reader = await request.multipart()
        async for part in reader:
            if part.name == "file":
                file_name, file_type = part.filename, part.headers.get("Content-Type")
                audio = bytes(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        if audio is None or not file_name:
            self.refused.append("no file part with a file name")
            return web.json_response({"error": {"message": "file is required"}}, status=400)
        if fields.get("model") != self.model:
            self.refused.append(f"model {fields.get('model')!r}")
            return web.json_response({"error": {"message": "model not found"}}, status=400)
        self.requests.append(TranscriptionRequest(model=fields["model"], language=fields.get("language"),
                                                  response_format=fields.get("response_format"),
                                                  file_name=file_name, content_type=file_type, audio=audio,
                                                  authorization=authorization))
        action, value = self._plan.popleft() if self._plan else ("text", None)
        if self.decide is not None:
            action, value = self.decide(self.requests[-1]), 500
        if action == "fail":
            return web.Response(status=int(value), text=f"server error for {authorization}")  # type: ignore[arg-type]
        if action == "hold":
            self.held += 1
            try:
                await self._released.wait()
            finally:
                self.held -= 1
        if self.echo:
            return web.json_response({"text": "heard " + audio.decode("utf-8", "replace")})
        text = self._texts.popleft() if self._texts else DEFAULT_TEXT
        return web.json_response({"text": text})


@pytest.fixture
async def transcriber() -> AsyncIterator[FakeTranscriber]:
    server = await FakeTranscriber(key="sk-fake-transcription-key-0123456789").start()
    try:
        yield server
    finally:
        await server.close()
