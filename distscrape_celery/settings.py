"""Process-wide settings, read from ``DISTSCRAPE_*`` environment variables once and validated.

Nothing else in the package reads the environment: the CLI and the Celery app build one
:class:`Settings` and pass it down.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from typing import Any, Optional

from pydantic import (
    BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
    model_validator,
)

from .errors import ConfigError, format_validation_error
from .redaction import redact
from .redis_urls import REDIS_SCHEMES, check_redis_url, is_redis_url
from .tracker.defaults import (
    DISPATCH_FACTOR, LEASE_SECONDS, REDIS_SOCKET_TIMEOUT, SAVE_BACKLOG_FACTOR,
)

ENV_PREFIX = "DISTSCRAPE_"
# DISTSCRAPE_CREDENTIAL_<NAME>: a credential a job spec's fetch.auth may name.
CREDENTIAL_PREFIX = ENV_PREFIX + "CREDENTIAL_"
# The name of a credential, as DISTSCRAPE_CREDENTIAL_<NAME> gives it and fetch.auth names it.
CREDENTIAL_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# The name of a proxy, as DISTSCRAPE_PROXIES gives it and fetch.proxies names it.
PROXY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")
# The robots.txt cache's bound in the tracker's Redis, shared by every job and worker: 1,024
# records of the 64 KiB a record may take at most (a hostile site's), some 25,000 of a usual 2
# KiB. Past it the records nearest their expiry go first, and are fetched again when next needed.
DEFAULT_ROBOTS_CACHE_BYTES = 64 * 1024 * 1024
# The shortest bearer token `distscrape api` takes: a guessable one would guard nothing.
MIN_API_TOKEN_CHARS = 16
# Settings that wait within a quarter of another's time, to leave room: a page waits for its save
# batch under its worker's lease (a slow broker round trip on top must not let the lease run
# out), and a task's time limit ends it with the item it carried on to.
WITHIN_A_QUARTER = {"save_batch_seconds": "lease_seconds", "carry_seconds": "task_time_limit"}


class Settings(BaseModel):
    """Settings of one process (worker, CLI); every field maps to ``DISTSCRAPE_<FIELD>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding the tracker; also the Celery broker unless broker_url is set.",
    )
    broker_url: Optional[str] = Field(
        None, description="Celery broker URL, when it is not the tracker's Redis: a standalone "
        "Redis or RabbitMQ (amqp://). Required with redis_cluster."
    )
    redis_cluster: bool = Field(
        False,
        description="redis_url names a node of a Redis Cluster: the tracker follows the "
        "cluster's slots (a sharded job spreads over its masters). Celery cannot use a cluster "
        "as its broker, so broker_url must then be set.",
    )
    queue_prefix: str = Field(
        "distscrape", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        description="Names the broker queues (<prefix>.scrape, <prefix>.save) and their "
        "exchanges: crawls that share a broker (a RabbitMQ, say) but not a tracker need their "
        "own. Workers and the CLI of one tracker must agree on it.",
    )
    lease_seconds: float = Field(
        LEASE_SECONDS,
        ge=0.5,
        le=86400,
        description="How long a worker may hold an item without a heartbeat before it is handed "
        "to another worker. Sets how fast work of a dead worker is recovered.",
    )
    redis_socket_timeout: float = Field(
        REDIS_SOCKET_TIMEOUT,
        ge=1,
        le=3600,
        description="Seconds a read from Redis (tracker and Redis broker) may hang before the "
        "connection is dropped and made again: how long a frozen or cut-off Redis can block a "
        "worker before it notices.",
    )
    task_time_limit: float = Field(
        300.0,
        ge=5,
        le=86400,
        description="Hard limit on one task's run time (prefork pool). A long task keeps its "
        "lease through heartbeats, so this, not the lease, bounds how long one item may take.",
    )
    carry_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        description="How long a scrape task goes on with more items of its job, each handed to "
        "it by the tracker as its last page ends, instead of leaving them to a message each: "
        "a page then costs no broker message, delivery or task run (docs/architecture.md, "
        "'Carrying on'). A stopping worker starts no more. 0: every item its own task, as "
        "Flower then shows. At most a quarter of task_time_limit.",
    )
    dispatch_factor: float = Field(
        DISPATCH_FACTOR,
        gt=0,
        le=100,
        description="The broker holds at most this many scrape messages per unit of live worker "
        "concurrency (at least one); the rest of the frontier waits in the tracker. Fewer "
        "leave worker threads idle more often; more keep more of the frontier in the broker, "
        "where each message holds its domain's slot until a task takes it, about once a second "
        "a task slot since tasks carry on (docs/architecture.md, 'The broker stays bounded').",
    )
    save_backlog_factor: int = Field(
        SAVE_BACKLOG_FACTOR,
        ge=1,
        le=100,
        description="The broker holds at most this many pages of save messages per unit of live "
        "worker concurrency; beyond that no more scrape messages are queued until saves catch up.",
    )
    worker_prune_seconds: float = Field(
        86400.0,
        ge=1,
        description="Seconds after its last heartbeat that a dead worker's records are removed; "
        "more than lease_seconds (a live worker beats several times a lease).",
    )

    broker_ack_emulation: bool = Field(
        False,
        description="With the Redis broker: keep every delivered message in kombu's unacked hash "
        "until its task ends, so that the broker redelivers the messages of a worker that died, "
        "after the visibility timeout. Off (the default: two MULTI blocks per message fewer, "
        "docs/performance.md), the tracker alone recovers them, within a lease (see docs/architecture.md, "
        "'Late acknowledgement and ack emulation').",
    )
    save_inline: bool = Field(
        False,
        description="Save each page in the worker process that downloaded it, with the pages it "
        "gathered for a save batch (save_batch_size; 1: each in its scrape task, at once), "
        "instead of queueing a save task. The page's body never passes through Redis, and a page "
        "costs Redis two tracker steps fewer (docs/performance.md, 'Saving'). Save workers of "
        "the save queue then get only deferred saves, Flower shows no save tasks, and a page "
        "whose process dies before it is saved is downloaded again (docs/architecture.md, "
        "'Saving inline'). Off for workers; on for distscrape crawl, whose processes share one "
        "machine.",
    )
    save_batch_size: int = Field(
        32,
        ge=1,
        le=1000,
        description="Most pages one save batch holds. A worker process gathers the saves of the "
        "pages it scraped for up to save_batch_seconds and queues them as one save task, with the "
        "links found in them: one broker message and one delivery for many pages "
        "(docs/performance.md); with save_inline it saves them itself, as one group. 1: a save "
        "task per page, sent at once (with save_inline: each page saved in its scrape task).",
    )
    save_batch_seconds: float = Field(
        0.2,
        ge=0,
        le=5,
        description="Longest a scraped page waits in its worker process for its save batch "
        "(default 0.2, or a quarter of a shorter lease). Until then the worker holds the "
        "page under its lease, so a worker that dies meanwhile costs a download again, one "
        "lease later. A save batch costs the tracker the same round trips whatever its pages: a "
        "longer wait gathers more pages into each (docs/performance.md).",
    )
    known_links_bytes: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Memory (bytes) each worker process may spend remembering the links it has "
        "passed to the tracker, so that a link found again on another page is not sent again "
        "(the tracker would only find it known). Oldest first out; 0: send every link.",
    )
    robots_cache_bytes: int = Field(
        DEFAULT_ROBOTS_CACHE_BYTES,
        ge=1024 * 1024,
        description="The most the robots.txt records of all jobs may take in the tracker's Redis "
        "(each at most 64 KiB), counted with their names; past it the records nearest their "
        "expiry are dropped (fetched again when next needed). Give every worker the same.",
    )
    save_timeout_seconds: Optional[float] = Field(
        None,
        ge=1,
        le=86400,
        description="How long a scraped item waits for its save task to start before it is "
        "presumed lost and scraped again; unset, 5 leases plus 30 s.",
    )

    plugin_modules: tuple[str, ...] = Field(
        (),
        description="Modules (comma-separated dotted names) from which a job spec's "
        "scraper.kind or saver.kind may name a class as module:Class: 'mypkg' allows mypkg and "
        "mypkg.*, not mypkgx. The built-in kinds are always allowed; any other module is refused "
        "before it is imported. A job spec comes from whoever can write to the tracker's Redis.",
    )
    output_roots: Optional[tuple[str, ...]] = Field(
        None,
        description="Absolute directories (comma-separated) under which a files, tar or warc "
        "saver's output must lie, symlinks followed. Unset, a worker refuses every such output "
        "(a job spec comes from whoever can write to the tracker's Redis); distscrape seed then "
        "checks nothing, and distscrape crawl allows its own output. Under a root, an output "
        "where Python imports from is refused still.",
    )

    postgres_dsn: Optional[str] = Field(
        None,
        description="The PostgreSQL database the postgres saver writes to, as a libpq connection "
        "string (postgresql://user@host:5432/db, or key=value pairs); its password is best left "
        "to ~/.pgpass or PGPASSWORD. A job spec names only the table: the address and its "
        "credentials stay with the workers. Unset, a job with the postgres saver fails its items.",
    )

    metrics_auth: Optional[str] = Field(
        None,
        description="USER:PASSWORD that `distscrape metrics` requires (HTTP basic auth); "
        "unset, it serves on a loopback address only.",
    )

    api_token: Optional[str] = Field(
        None,
        description="The bearer token `distscrape api` requires of every request (at least "
        f"{MIN_API_TOKEN_CHARS} characters); see api_token_file.",
    )
    api_token_file: Optional[str] = Field(
        None,
        description="A file whose first line is that token (a mounted Secret, say): read by "
        "`distscrape api` instead of api_token.",
    )

    proxies: dict[str, str] = Field(
        default_factory=dict, repr=False,
        description="The proxies job specs may choose by name (fetch.proxies), as "
        "NAME=URL pairs, comma-separated: e.g. eu=http://user:pw@10.0.0.5:3128,"
        "tor=socks5h://127.0.0.1:9050 (http, https, socks5, socks5h). A proxy's credentials "
        "stay here: a spec names the proxy only.",
    )
    ca_bundle: Optional[str] = Field(
        None,
        description="A PEM file of the certificate authorities whose certificates the workers "
        "accept from https:// sites and https:// proxies, instead of certifi's bundle. To trust "
        "a private CA as well as the public ones, give a copy of certifi's bundle (python -m "
        "certifi prints its path) with the private CA's certificate appended. Unset: certifi's.",
    )
    credentials: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Not one variable: each DISTSCRAPE_CREDENTIAL_<NAME> is the credential "
        "NAME that a job spec's fetch.auth may name (a bearer token, or USER:PASSWORD for basic "
        "auth). Never stored in Redis, never logged.",
    )

    @field_validator("proxies", mode="before")
    @classmethod
    def _split_proxies(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        proxies: dict[str, str] = {}
        for pair in value.split(","):
            if not pair.strip():
                continue
            name, equals, url = pair.strip().partition("=")
            if not equals:
                raise ValueError(f"{redact(pair.strip())!r} is not NAME=URL")
            if name in proxies:
                raise ValueError(f"proxy {name!r} is given twice")
            proxies[name] = url.strip()
        return proxies

    @field_validator("proxies")
    @classmethod
    def _check_proxies(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not PROXY_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a proxy name (letters, digits, '_.-')")
            scheme, sep, rest = url.partition("://")
            host = rest.rpartition("@")[2].split("/", 1)[0]
            if not sep or scheme.lower() not in PROXY_SCHEMES or not host:
                raise ValueError(
                    f"proxy {name!r}: {redact(url)!r} is not a proxy URL "
                    f"({', '.join(PROXY_SCHEMES)}://[user:password@]host:port)")
        return value

    @field_validator("ca_bundle")
    @classmethod
    def _check_ca_bundle(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        # Loaded here as the fetchers will load it, so a bad file stops the worker at its start
        # rather than failing every https:// item.
        try:
            context = ssl.create_default_context(cafile=value)
        except OSError as exc:  # ssl.SSLError is an OSError too; its reason is the useful part
            reason = (exc.reason if isinstance(exc, ssl.SSLError) and exc.reason
                      else exc.strerror or str(exc))
            raise ValueError(f"cannot load {value!r} as a PEM bundle of CA certificates: "
                             f"{reason}") from None
        if not context.get_ca_certs():
            raise ValueError(f"{value!r} holds no CA certificate")
        # Absolute: the worker processes it starts may run elsewhere.
        return os.path.abspath(value)

    @field_validator("credentials")
    @classmethod
    def _check_credentials(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            if not CREDENTIAL_NAME.fullmatch(name):
                raise ValueError(
                    f"{CREDENTIAL_PREFIX}{name}: a credential name is upper-case letters, digits "
                    "and '_', starting with a letter")
            text = secret.get_secret_value()
            # It goes into a header: a line break would split it, and an error naming the bad
            # header would show it. The message never repeats the value.
            if not text or not text.isprintable() or not text.isascii():
                raise ValueError(
                    f"{CREDENTIAL_PREFIX}{name}: must be one line of printable ASCII characters")
        return value

    @field_validator(*WITHIN_A_QUARTER)
    @classmethod
    def _check_within_a_quarter(cls, value: float, info: ValidationInfo) -> float:
        other = WITHIN_A_QUARTER[info.field_name]
        bound = info.data.get(other)
        if bound is not None and value > bound / 4:
            raise ValueError(f"must be at most a quarter of {other} ({bound:g})")
        return value

    @field_validator("worker_prune_seconds")
    @classmethod
    def _check_worker_prune_seconds(cls, value: float, info: ValidationInfo) -> float:
        lease = info.data.get("lease_seconds")
        if lease is not None and value <= lease:
            raise ValueError(f"must be more than lease_seconds ({lease:g})")
        return value

    @field_validator("plugin_modules", "output_roots", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        # The environment gives a list as one comma-separated string; blanks around names and
        # an empty last element (a trailing comma) are dropped.
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("plugin_modules")
    @classmethod
    def _check_plugin_modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not is_dotted_name(name):
                raise ValueError(f"{name!r} is not a dotted module name (such as mypkg.scrapers)")
        return value

    @field_validator("output_roots")
    @classmethod
    def _check_output_roots(cls, value: Optional[tuple[str, ...]]) -> Optional[tuple[str, ...]]:
        if value is None:
            return value
        if not value:
            # Set but empty is more likely a mistake than a wish to refuse what unset refuses.
            raise ValueError("names no directory; give at least one (e.g. /data)")
        for root in value:
            if not os.path.isabs(root):
                raise ValueError(f"{root!r} is not an absolute path")
        return tuple(os.path.normpath(root) for root in value)

    @field_validator("metrics_auth")
    @classmethod
    def _check_metrics_auth(cls, value: Optional[str]) -> Optional[str]:
        user, sep, password = (value or "").partition(":")
        if value is not None and not (user and sep and password):
            # The value is a credential: the message must not repeat it.
            raise ValueError("must be USER:PASSWORD, both non-empty")
        return value

    @field_validator("api_token")
    @classmethod
    def _check_api_token(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            check_api_token(value)
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        return check_redis_url(value)

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme in REDIS_SCHEMES:
            return check_redis_url(value)
        if not scheme:
            raise ValueError(f"{redact(value)!r} is not a URL (expected e.g. redis://host:6379/0)")
        return value  # another Celery broker (amqp://, ...): Celery checks it

    @model_validator(mode="before")
    @classmethod
    def _save_batch_seconds_within_the_lease(cls, data: Any) -> Any:
        """Unset, the save batches wait the default or a quarter of a shorter lease (a page
        waits under its lease); a value given is checked instead (``_check_save_batch_seconds``)."""
        if not isinstance(data, dict) or data.get("save_batch_seconds") is not None:
            return data
        try:
            lease = float(data.get("lease_seconds", cls.model_fields["lease_seconds"].default))
        except (TypeError, ValueError):
            return data  # lease_seconds's own check names what is wrong with it
        default = cls.model_fields["save_batch_seconds"].default
        return {**data, "save_batch_seconds": min(default, max(lease, 0.0) / 4)}

    @model_validator(mode="after")
    def _cluster_needs_broker(self) -> "Settings":
        if self.redis_cluster and self.broker_url is None:
            # Raised as a ValueError of the model: the message names both settings itself.
            raise ValueError(
                f"{ENV_PREFIX}BROKER_URL must be set when {ENV_PREFIX}REDIS_CLUSTER is true: "
                "Celery cannot use a Redis Cluster as its broker (use a standalone Redis or "
                "RabbitMQ, amqp://...)"
            )
        return self

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_is_redis(self) -> bool:
        return is_redis_url(self.effective_broker_url)

    @property
    def scrape_queue(self) -> str:
        return f"{self.queue_prefix}.scrape"

    @property
    def save_queue(self) -> str:
        return f"{self.queue_prefix}.save"

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between a worker's heartbeats; several fit in one lease."""
        return min(max(self.lease_seconds / 4, 0.2), 10.0)

    @property
    def task_soft_time_limit(self) -> float:
        """When a task is asked to stop (it then fails its item, which is retried)."""
        return 0.9 * self.task_time_limit

    @property
    def visibility_timeout(self) -> float:
        """Celery's redelivery delay on the Redis broker: the task time limit plus two leases.

        The tracker recovers lost work within a lease on its own; the broker's redelivery is only a
        backstop, so it may be late but must never fire while a task can still be running.
        """
        return self.task_time_limit + 2 * self.lease_seconds

    @property
    def save_timeout(self) -> float:
        """How long a scraped item waits for its save task to start before it is presumed lost
        and scraped again: ``save_timeout_seconds`` if set, else 5 leases plus 30 s (330 s by
        default). Save messages count against the broker's bound, so a save that has to wait
        this long in a healthy crawl is rare; once a worker has prefetched it, the item follows
        that worker's heartbeat instead."""
        if self.save_timeout_seconds is not None:
            return self.save_timeout_seconds
        return 5 * self.lease_seconds + 30.0

    @property
    def save_retry_delay(self) -> float:
        """Seconds before a save that found the output full is tried again (well under the
        visibility timeout, so the delayed message is never redelivered meanwhile)."""
        return min(max(self.lease_seconds, 1.0), 30.0)

    @property
    def body_ttl(self) -> float:
        """How long a staged body is kept: past the save timeout and the broker's redelivery of a
        save whose worker died, so it outlives its item's wait."""
        return self.save_timeout + self.visibility_timeout

    @classmethod
    def from_env(
        cls, environ: Optional[Mapping[str, str]] = None, *,
        defaults: Optional[Mapping[str, object]] = None, **overrides: object
    ) -> "Settings":
        """Build settings from ``environ`` (default: the process environment) plus overrides;
        ``defaults`` stand in for the declared defaults of a command
        (``local.shape.CRAWL_DEFAULTS``).

        Unknown ``DISTSCRAPE_*`` variables are rejected, so a typo is an error, not a silent default.
        """
        environ = os.environ if environ is None else environ
        known = {ENV_PREFIX + name.upper() for name in cls.model_fields} - {
            ENV_PREFIX + "CREDENTIALS"}
        unknown = sorted(
            k for k in environ if k.startswith(ENV_PREFIX) and k not in known
            and not k.startswith(("DISTSCRAPE_TEST_", CREDENTIAL_PREFIX))
        )
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values: dict[str, object] = dict(defaults or {})
        values.update({
            name: environ[ENV_PREFIX + name.upper()]
            for name in cls.model_fields
            if ENV_PREFIX + name.upper() in environ and name != "credentials"
        })
        credentials = {k[len(CREDENTIAL_PREFIX):]: v for k, v in environ.items()
                       if k.startswith(CREDENTIAL_PREFIX)}
        if credentials:
            values["credentials"] = credentials
        given = {k: v for k, v in overrides.items() if v is not None}
        values.update(given)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            # A value given as an override came from a command-line option of that name.
            names = {name: "--" + name.replace("_", "-") for name in given}
            raise ConfigError(format_validation_error(exc, prefix=ENV_PREFIX, names=names)) from None

    def to_env(self) -> dict[str, str]:
        """The ``DISTSCRAPE_*`` variables that recreate these settings in a child process."""
        env = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name == "credentials":
                env.update({CREDENTIAL_PREFIX + key: secret.get_secret_value()
                            for key, secret in value.items()})
            elif name == "proxies":
                if value:
                    env[ENV_PREFIX + "PROXIES"] = ",".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, tuple):
                env[ENV_PREFIX + name.upper()] = ",".join(value)
            elif value is not None:
                env[ENV_PREFIX + name.upper()] = str(value)
        return env


def is_dotted_name(name: str) -> bool:
    """Whether ``name`` is a module name: identifiers joined by dots (``mypkg.scrapers``)."""
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def check_api_token(token: str) -> str:
    """``token`` if it is fit to be the job API's bearer token, else ValueError. The message
    never repeats the token."""
    if len(token) < MIN_API_TOKEN_CHARS:
        raise ValueError(f"must be at least {MIN_API_TOKEN_CHARS} characters "
                         "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe())')")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("must be printable ASCII without spaces")
    return token
