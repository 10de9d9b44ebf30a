"""The speech adapter: an OpenAI-compatible transcription endpoint, over HTTP (aiohttp)."""
