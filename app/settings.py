"""Configuration: environment variables with the ``TOPICBUS_`` prefix (and ``.env`` when present).

One place defines every knob; ``load_settings`` turns validation errors into one readable line per
problem, naming the variable and never echoing its value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from topicbus.core.display import DisplayMode

ENV_PREFIX = "TOPICBUS_"

# Values a newcomer copies from .env.example without filling in. They are taken as "not set" (so a
# follower machine with an untouched TOPICBUS_CHAT_ID still runs) and named where they are needed.
PLACEHOLDER_PREFIX = "replace-with"
OLD_PLACEHOLDERS = {"owner_ids": "123456789"}  # .env.example of topicbus 0.1
PLACEHOLDER_FIELDS = ("bot_token", "chat_id", "owner_ids", "bus_secret")
BOT_TOKEN_SHAPE = re.compile(r"\d+:[A-Za-z0-9_-]+")
SUPERGROUP_PREFIX = "-100"


class Settings(BaseSettings):
    """Everything the leader and the follower side read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    # --- leader: Telegram -------------------------------------------------------------------
    bot_token: SecretStr | None = None
    chat_id: int | None = None
    owner_ids: Annotated[frozenset[int], NoDecode] = frozenset()
    api_base_url: str = "https://api.telegram.org/bot"
    poll_timeout_s: float = Field(default=10.0, ge=0, le=50)
    rate_limit_per_second: float = Field(default=30.0, gt=0)
    rate_limit_per_chat_per_minute: float = Field(default=20.0, gt=0)
    rate_limit_per_chat_per_second: float = Field(default=1.0, gt=0)
    rate_limit_window_s: float = Field(default=60.0, gt=0)  # Telegram's minute; shorter only to compress time
    budget_reserve: int = Field(default=4, ge=0)

    # --- leader: how output looks ------------------------------------------------------------
    output_file_threshold: int = Field(default=3 * 4096, ge=0)  # UTF-16 units; 0: never a file
    live_message_s: float = Field(default=60.0, ge=0)  # 0: never grow a message by edits
    stream_quiet_s: float = Field(default=3.0, gt=0)
    output_coalesce: bool = True  # False: one message per output item, as the first release (comparisons)
    outbox_max_items: int = Field(default=1000, gt=0)  # per follower
    outbox_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)  # per follower

    # --- leader: storage and bus --------------------------------------------------------------
    db_path: Path = Path("./data/topicbus.sqlite3")
    db_synchronous: Literal["full", "normal"] = "full"
    bus_host: str = "127.0.0.1"
    bus_port: int = Field(default=8765, ge=0, le=65535)
    bus_secret: SecretStr | None = None

    # --- leader: lifecycle ---------------------------------------------------------------------
    follower_stale_after_ms: int = Field(default=15_000, gt=0)
    prune_interval_ms: int = Field(default=1_000, gt=0)
    lease_refresh_ms: int = Field(default=2_000, gt=0)
    lease_stale_after_ms: int = Field(default=8_000, gt=0)
    thread_cleanup: bool = True
    cleanup_grace_s: float = Field(default=600.0, ge=0)  # a finished agent's topic is deleted after this
    display_mode: DisplayMode | None = None  # None: the database's default (names when new)

    # --- leader: inbound ---------------------------------------------------------------------
    offline_ttl_s: float = Field(default=86_400.0, gt=0)  # messages for an offline agent expire after this
    receipt_reaction: str = "👀"  # reaction on an owner message once its agent has it; "off": none

    # --- leader: voice notes as text (an OpenAI-compatible transcription endpoint) -------------
    transcribe_url: str | None = None  # base URL; the leader POSTs to <base>/v1/audio/transcriptions
    transcribe_key_file: Path | None = None  # a file holding the endpoint's key (sent as a Bearer token)
    transcribe_model: str = Field(default="whisper-1", min_length=1, max_length=200)
    transcribe_language: str | None = Field(default=None, max_length=32)  # e.g. "en"; unset: the endpoint guesses
    transcribe_max_s: int = Field(default=300, gt=0, le=3600)  # longer notes are delivered as files
    transcribe_timeout_s: float = Field(default=60.0, gt=0, le=600)  # download and transcription together

    # --- follower side ----------------------------------------------------------------------
    leader_url: str = "ws://127.0.0.1:8765/v1/bus"
    heartbeat_interval_ms: int = Field(default=1_000, gt=0)

    # --- logging ----------------------------------------------------------------------------
    log_level: str = "INFO"
    log_json: bool = False

    # --- bus hardening: TLS, connection hygiene, send queues, honest health -----------------------
    bus_tls_cert: Path | None = None  # leader: PEM certificate (chain) for wss:// and https://
    bus_tls_key: Path | None = None  # leader: PEM private key of that certificate
    bus_ca_file: Path | None = None  # follower side: CA bundle to trust (a self-signed leader certificate)
    bus_max_connections: int = Field(default=512, ge=2)
    bus_max_unauthenticated: int = Field(default=64, ge=1)
    bus_head_timeout_s: float = Field(default=10.0, gt=0)
    bus_handshake_timeout_s: float = Field(default=10.0, gt=0)
    bus_register_timeout_s: float = Field(default=30.0, gt=0)
    bus_ping_interval_s: float = Field(default=20.0, gt=0)
    bus_write_timeout_s: float = Field(default=10.0, gt=0)
    bus_send_queue_kb: int = Field(default=1024, ge=64)
    bus_max_downloads: int = Field(default=4, ge=1)
    health_poll_deadline_s: float = Field(default=60.0, gt=0)

    _placeholders: frozenset[str] = PrivateAttr(default=frozenset())
    _transcribe_key: str | None = PrivateAttr(default=None)
    _transcribe_key_problem: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _set_aside_placeholders(cls, data: Any, handler: Any) -> Settings:
        found = set()
        if isinstance(data, dict):
            data = dict(data)
            for name in PLACEHOLDER_FIELDS:
                value = data.get(name)
                if isinstance(value, str) and (value.strip().lower().startswith(PLACEHOLDER_PREFIX)
                                               or value.strip() == OLD_PLACEHOLDERS.get(name)):
                    found.add(name)
                    del data[name]
        settings = handler(data)
        settings._placeholders = frozenset(found)
        return settings


    @field_validator("owner_ids", mode="before")
    @classmethod
    def _split_owner_ids(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            try:
                return frozenset(int(p) for p in parts)
            except ValueError as exc:
                raise ValueError("must be comma-separated integer Telegram user ids") from exc
        return value

    @field_validator("db_synchronous", mode="before")
    @classmethod
    def _lower_sync(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        if isinstance(value, str):
            level = value.strip().upper()
            if level not in {"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"}:
                raise ValueError("must be one of TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL")
            return level
        return value

    @field_validator("api_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("transcribe_url", "transcribe_language", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("transcribe_url")
    @classmethod
    def _transcribe_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError("must be the base URL of an OpenAI-compatible API, starting with http:// or https:// "
                             "(the leader posts to <base>/v1/audio/transcriptions)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _read_transcribe_key(self) -> Settings:
        """The endpoint's key, read once from its file (never from the environment itself)."""
        path = self.transcribe_key_file
        if path is None:
            return self
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            self._transcribe_key_problem = (f"cannot read {path} "
                                            f"({getattr(exc, 'strerror', None) or type(exc).__name__})")
            return self
        if not key or any(c.isspace() for c in key):
            self._transcribe_key_problem = f"{path} must hold the key alone, on one line"
            return self
        self._transcribe_key = key
        return self

    @field_validator("leader_url")
    @classmethod
    def _ws_url(cls, value: str) -> str:
        if not value.startswith(("ws://", "wss://")):
            raise ValueError("must start with ws:// or wss://")
        return value

    # --- derived ------------------------------------------------------------------------------
    def secrets(self) -> list[str]:
        """The secret values that must never reach a log line."""
        found = [s.get_secret_value() for s in (self.bot_token, self.bus_secret) if s is not None]
        return found + ([self._transcribe_key] if self._transcribe_key else [])

    @property
    def transcribe_key(self) -> str | None:
        """The transcription endpoint's key, read from ``TOPICBUS_TRANSCRIBE_KEY_FILE`` (None: no key)."""
        return self._transcribe_key

    def is_placeholder(self, name: str) -> bool:
        """``name`` (a field) still holds the placeholder value from ``.env.example``."""
        return name in self._placeholders

    def placeholder_problem(self, name: str) -> str:
        return f"{ENV_PREFIX}{name.upper()}: {PLACEHOLDER_FIXES[name]}"

    def leader_problems(self) -> list[str]:
        """Problems that stop ``topicbus leader`` from starting (variables the leader requires)."""
        problems = []
        token = self.bot_token.get_secret_value().strip() if self.bot_token is not None else ""
        if self.is_placeholder("bot_token"):
            problems.append(self.placeholder_problem("bot_token"))
        elif not token:
            problems.append(f"{ENV_PREFIX}BOT_TOKEN: {LEADER_REQUIRED['bot_token']}")
        elif not BOT_TOKEN_SHAPE.fullmatch(token):
            problems.append(f"{ENV_PREFIX}BOT_TOKEN: does not look like a bot token; @BotFather's look like "
                            "123456789:AAE… (digits, a colon, letters), without quotes, spaces or a 'bot' prefix")
        if self.is_placeholder("chat_id"):
            problems.append(self.placeholder_problem("chat_id"))
        elif self.chat_id is None:
            problems.append(f"{ENV_PREFIX}CHAT_ID: {LEADER_REQUIRED['chat_id']}")
        elif (hint := self._chat_id_hint()) is not None:
            problems.append(f"{ENV_PREFIX}CHAT_ID: {hint}")
        if self.is_placeholder("owner_ids"):
            problems.append(self.placeholder_problem("owner_ids"))
        elif not self.owner_ids:
            problems.append(f"{ENV_PREFIX}OWNER_IDS: {LEADER_REQUIRED['owner_ids']}")
        if (self.bus_tls_cert is None) != (self.bus_tls_key is None):
            missing = "BUS_TLS_KEY" if self.bus_tls_key is None else "BUS_TLS_CERT"
            problems.append(f"{ENV_PREFIX}{missing}: required with {ENV_PREFIX}BUS_TLS_"
                            f"{'CERT' if missing.endswith('KEY') else 'KEY'} (TLS needs both a certificate and its key)")
        if self.is_placeholder("bus_secret"):
            problems.append(self.placeholder_problem("bus_secret"))
        if self._transcribe_key_problem is not None:
            problems.append(f"{ENV_PREFIX}TRANSCRIBE_KEY_FILE: {self._transcribe_key_problem}")
        return problems

    def _chat_id_hint(self) -> str | None:
        """A chat id that cannot be a forum: a basic group's, or a user's who is not an owner."""
        chat_id = self.chat_id
        assert chat_id is not None
        if chat_id < 0 and not str(chat_id).startswith(SUPERGROUP_PREFIX):
            return (f"{chat_id} is a basic group's id, and topics need a supergroup, whose id starts with -100. "
                    "Turn on Topics in the group's settings (the group then gets a new id) and read the id "
                    "again (README, Quick start, step 5)")
        if chat_id > 0 and self.owner_ids and chat_id not in self.owner_ids:
            return (f"{chat_id} is not a forum group's id (those start with -100: if you copied it from a "
                    f"t.me/c/ link, use -100{chat_id}), and not one of {ENV_PREFIX}OWNER_IDS (for topics in "
                    "your private chat with the bot, use your own user id)")
        return None

    @property
    def _local_bus_host(self) -> str:
        if self.bus_host in ("0.0.0.0", "::", ""):
            return "127.0.0.1"
        return f"[{self.bus_host}]" if ":" in self.bus_host else self.bus_host

    @property
    def status_url(self) -> str:
        scheme = "https" if self.bus_tls_cert is not None else "http"
        return f"{scheme}://{self._local_bus_host}:{self.bus_port}/v1/status"

    def bus_url(self, port: int | None = None) -> str:
        """Where followers on this machine reach the bus (``port``: the one actually bound)."""
        scheme = "wss" if self.bus_tls_cert is not None else "ws"
        return f"{scheme}://{self._local_bus_host}:{port or self.bus_port}/v1/bus"


class ConfigurationError(Exception):
    """Invalid configuration; ``problems`` holds one readable line per variable."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def describe_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = "__".join(str(p) for p in err["loc"]) or "?"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        lines.append(f"{ENV_PREFIX}{loc.upper()}: {msg}")
    return lines


PLACEHOLDER_FIXES = {
    "bot_token": "still the placeholder from .env.example: paste the token @BotFather gave you",
    "chat_id": ("still the placeholder from .env.example: the forum group's id, a negative number "
                "starting with -100 (README, Quick start, step 5)"),
    "owner_ids": ("still the placeholder from .env.example: your own Telegram user id "
                  "(README, Quick start, step 5)"),
    "bus_secret": ("still the placeholder from .env.example, which anyone can read: use a long random "
                   "string, e.g. the output of `openssl rand -hex 32`"),
}

LEADER_REQUIRED = {
    "bot_token": "required (the bot token from BotFather)",
    "chat_id": "required (forum supergroup id, or the owner's user id)",
    "owner_ids": "required (comma-separated Telegram user ids)",
}


def missing_leader_variables(env_file: str | os.PathLike[str] | None = ".env") -> list[str]:
    """Required leader variables absent from both the environment and ``env_file``, or still holding
    the placeholder from ``.env.example`` (for reporting them together with validation errors, so
    an operator sees every problem at once)."""
    from dotenv import dotenv_values

    file_values = dotenv_values(env_file) if env_file and Path(env_file).is_file() else {}
    lines = []
    for field, why in LEADER_REQUIRED.items():
        name = f"{ENV_PREFIX}{field.upper()}"
        value = os.environ.get(name, file_values.get(name))
        if value is None or not str(value).strip():
            lines.append(f"{name}: {why}")
        elif str(value).strip().lower().startswith(PLACEHOLDER_PREFIX) or str(value).strip() == OLD_PLACEHOLDERS.get(field):
            lines.append(f"{name}: {PLACEHOLDER_FIXES[field]}")
    return lines


def missing_env_file_hint(env_file: str | os.PathLike[str] | None = ".env") -> str | None:
    """Why variables may be missing: there is no ``.env`` here; and how to make one."""
    if env_file is None or Path(env_file).is_file():
        return None
    where = Path(env_file).absolute().parent
    if (where / ".env.example").is_file():
        return f"no .env file in {where}: create it with `cp .env.example .env`, then fill it in"
    return (f"no .env file in {where}: copy .env.example from the topicbus repository to {where / '.env'} "
            "and fill it in, or set the variables in the environment")


def load_settings(env_file: str | os.PathLike[str] | None = ".env", **overrides: Any) -> Settings:
    """Read settings, raising :class:`ConfigurationError` with readable lines on bad input."""
    try:
        return Settings(_env_file=env_file, **overrides)  # type: ignore[call-arg]
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc)) from None
