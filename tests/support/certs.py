"""Self-signed certificates for the TLS tests: fixed files in ``tests/support/tls/``.

``bus`` and ``other`` are two unrelated self-signed certificates for ``127.0.0.1`` and ``localhost``
(EC P-256, valid for 100 years from 2026-12-01), made once with::

    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500 \\
        -keyout NAME.key -out NAME.crt -subj /CN=127.0.0.1 \\
        -addext subjectAltName=IP:127.0.0.1,DNS:localhost -addext basicConstraints=critical,CA:TRUE

Their keys protect nothing but these tests. Fixed files keep ``cryptography`` out of the test
extras: PTB imports it whenever it is installed, which made the leader's memory figures in
``bench/`` larger than in a production install (docs/performance.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

_FIXTURES = Path(__file__).with_name("tls")


def self_signed(directory: Path, *, name: str = "bus") -> tuple[Path, Path]:
    """Copy ``NAME.crt`` and ``NAME.key`` (PEM; ``name`` is ``bus`` or ``other``) into ``directory``,
    the key with mode 0600. Returns (certificate, key)."""
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    shutil.copyfile(_FIXTURES / f"{name}.crt", cert_path)
    shutil.copyfile(_FIXTURES / f"{name}.key", key_path)
    key_path.chmod(0o600)
    return cert_path, key_path
