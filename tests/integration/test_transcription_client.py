"""The transcription endpoint's client (``topicbus.speech.client``) against the fake OpenAI-compatible
endpoint: the multipart request it makes, and how a refusal, an error and a slow answer come back
(a :class:`TranscriptionFailed` whose reason never holds the key)."""

from __future__ import annotations

import pytest

from tests.support.fake_transcriber import FakeTranscriber, transcriber  # noqa: F401 - the fixture
from topicbus.speech.client import TranscriptionClient, TranscriptionEndpoint, TranscriptionFailed


def client_for(server: FakeTranscriber, *, key: str | None = None, **fields) -> TranscriptionClient:
    return TranscriptionClient(TranscriptionEndpoint(base_url=server.base_url + "/", key=key, **fields))


async def test_the_request_carries_the_file_the_model_the_language_and_the_key(transcriber: FakeTranscriber):
    client = client_for(transcriber, key=transcriber.key, language="de")
    transcriber.answer("Guten Morgen")
    try:
        text = await client.transcribe(b"OggS bytes", file_name="voice.ogg", mime_type="audio/ogg", timeout_s=10)
    finally:
        await client.close()
    assert text == "Guten Morgen"
    [request] = transcriber.requests
    assert (request.audio, request.file_name, request.content_type, request.model, request.language,
            request.response_format, request.authorization) == (
        b"OggS bytes", "voice.ogg", "audio/ogg", "whisper-1", "de", "json", f"Bearer {transcriber.key}")


async def test_a_refusal_an_error_and_a_slow_answer_fail_with_a_reason_that_holds_no_key(
        transcriber: FakeTranscriber):
    wrong = client_for(transcriber, key="sk-wrong-key-0123456789")
    right = client_for(transcriber, key=transcriber.key)
    other_model = client_for(transcriber, key=transcriber.key, model="large-v3")
    reasons = []
    try:
        for client, timeout in ((wrong, 10), (other_model, 10)):
            with pytest.raises(TranscriptionFailed) as caught:
                await client.transcribe(b"audio", file_name="v.ogg", mime_type=None, timeout_s=timeout)
            reasons.append(str(caught.value))
        transcriber.fail_next(500)
        with pytest.raises(TranscriptionFailed) as caught:
            await right.transcribe(b"audio", file_name="v.ogg", mime_type=None, timeout_s=10)
        reasons.append(str(caught.value))
        transcriber.hold_next()
        with pytest.raises(TranscriptionFailed) as caught:
            await right.transcribe(b"audio", file_name="v.ogg", mime_type=None, timeout_s=0.5)
        reasons.append(str(caught.value))
    finally:
        for client in (wrong, right, other_model):
            await client.close()
    assert reasons == ["the endpoint answered HTTP 401", "the endpoint answered HTTP 400",
                       "the endpoint answered HTTP 500", "no answer within 0.5 s"]
    assert transcriber.refused == ["wrong or missing key", "model 'large-v3'"]
    assert not any(transcriber.key in r or "sk-wrong" in r for r in reasons)
