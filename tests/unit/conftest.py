"""Unit layer: pure logic, in-process, no network and no fake servers.

Tests here import product modules, ``tests.support`` helpers and test libraries only: never
``tests.fakebotapi``, ``tests.fakeleader`` or the integration/e2e harnesses (checked by
``tests/support/test_layout.py``). Concurrency is driven with ``asyncio.Event`` holds and condition
waits (``tests.support.waiting.wait_until``), never with sleeps."""
