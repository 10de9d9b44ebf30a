# syntax=docker/dockerfile:1
# topicbus leader image: one container per bot token, SQLite on the /data volume.
# Build: docker build -t topicbus .
# Run:   docker run -d --env-file .env -v topicbus-data:/data -p 127.0.0.1:8765:8765 --init topicbus
# Comments stay on their own lines: a trailing "# ..." would become part of an instruction.
# Pin a digest (python:3.11-slim-bookworm@sha256:...) for reproducible builds.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# DejaVu Sans Mono for follow --pty's /screen pictures (without it Pillow's built-in font is used).
RUN apt-get update \
    && apt-get install -y --no-install-recommends fonts-dejavu-core \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# Install the package from source. The migrations ship inside it as package data, so nothing
# from the source tree is needed at run time.
WORKDIR /build
COPY pyproject.toml README.md ./
COPY app/ ./app/
COPY handlers/ ./handlers/
COPY storage/ ./storage/
COPY migrations/ ./migrations/
RUN pip install . && rm -rf /build

# Unprivileged user; /data belongs to it so a fresh named volume is writable.
# A bind-mounted directory must be writable by uid 10001.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/topicbus topicbus \
    && mkdir -p /data \
    && chown topicbus:topicbus /data
WORKDIR /home/topicbus
USER 10001:10001

# Image defaults: database on the volume, bus reachable through the published port. The bus
# listens on all of the container's interfaces; publish it on the host's loopback (as below and
# in docker-compose.yml), or set TOPICBUS_BUS_TLS_CERT/KEY before publishing it further.
ENV TOPICBUS_DB_PATH=/data/topicbus.sqlite3 \
    TOPICBUS_BUS_HOST=0.0.0.0

# SQLite database plus its -wal/-shm files: keep it on a local volume, never on NFS.
VOLUME ["/data"]

# Follower bus (/v1/bus) and HTTP endpoints (/healthz, /metrics, /v1/status).
EXPOSE 8765

# /healthz answers 200 for a polling leader and for a standby, 503 with reasons while a leader is
# starting, has not completed a poll in time, cannot refresh its lease or write its journal
# (docs/operations.md#health-reasons). urlopen raises on 503 or no answer, which exits 1. With
# TOPICBUS_BUS_TLS_CERT set it asks over https; the certificate is not checked on this loopback call.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, ssl, sys, urllib.request; port = os.environ.get('TOPICBUS_BUS_PORT', '8765'); tls = bool(os.environ.get('TOPICBUS_BUS_TLS_CERT')); url = ('https' if tls else 'http') + '://127.0.0.1:' + port + '/healthz'; sys.exit(0 if urllib.request.urlopen(url, timeout=4, context=ssl._create_unverified_context() if tls else None).status == 200 else 1)"]

# docker stop sends SIGTERM: the leader stops polling, releases its lease and exits 0.
STOPSIGNAL SIGTERM

# Exec form: the leader itself receives the signal (PID 1, or under --init / init: true).
CMD ["topicbus", "leader"]
