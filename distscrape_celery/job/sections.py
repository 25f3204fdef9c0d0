"""The sections of a job spec that set limits (fetch, politeness, tracker), and what every
section shares: a strict model, and the checks of a ``kind`` and of a field's name in errors.

The two sections that choose a class by ``kind`` and check their options against it have their own
modules: :mod:`.scraper_spec` and :mod:`.saver_spec`; :mod:`.spec` joins them all into the job's
spec."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from .fetch_policy_spec import (
    AuthSpec, DomainFetchSpec, Headers, ProxyNames, check_domain_keys,
)
from .strict import StrictModel
from ..tracker.defaults import DOMAIN_CONCURRENCY
from ..tracker.model import DomainLimits


_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check_kind(value: str, builtin: tuple[str, ...]) -> str:
    """``value`` if it names one of the ``builtin`` kinds or a class as ``package.module:Class``;
    else ValueError listing the choices."""
    if value in builtin or _DOTTED.match(value):
        return value
    raise ValueError(
        f"unknown kind {value!r}: use one of {', '.join(builtin)} or a class as 'package.module:Class'"
    )


def field_label(info: ValidationInfo, field: str, default: Optional[str] = None) -> str:
    """How the person who wrote the spec calls ``field`` (an option such as ``--id-regex``)."""
    names = (info.context or {}).get("names") or {}
    return names.get(field, default or field)


class FetchSpec(StrictModel):
    """Limits on every download; a fetch never runs without a timeout."""

    connect_timeout: float = Field(10.0, gt=0, le=600)
    read_timeout: float = Field(30.0, gt=0, le=3600)
    total_timeout: float = Field(60.0, gt=0, le=3600, description="Whole download, body included.")
    max_bytes: int = Field(10 * 1024 * 1024, gt=0, description="Largest body kept, after decoding.")
    max_redirects: int = Field(5, ge=0, le=30)
    user_agent: str = Field(
        "distscrape-celery/0.1",
        min_length=1, description="Sent with every request, and matched against robots.txt.",
    )
    obey_robots: bool = Field(True, description="Fetch nothing robots.txt disallows.")
    robots_cache_seconds: float = Field(
        86400.0, gt=0, description="How long a host's robots.txt is kept (in Redis) before it "
        "is fetched again.",
    )
    robots_retry_seconds: float = Field(
        10.0, gt=0, le=86400,
        description="A host whose robots.txt could not be read (a 5xx, a timeout, a refused "
        "connection) is asked again after this long, not after robots_cache_seconds; its items "
        "retry then, so a dead host's items end after about max_retries x this long.",
    )
    allow_private: bool = Field(
        False,
        description="Let the job reach private, loopback, link-local and reserved addresses. "
        "Without it only the address and port a seed URL gives literally (an IP address, or "
        "localhost) are allowed, and only through URLs that name them literally too; a name's "
        "DNS answer never is.",
    )

    headers: Headers = Field(
        default_factory=dict,
        description='Sent with every request, e.g. {"Accept-Language" = "en"}; '
        "fetch.domains adds a domain's own.",
    )
    auth: Optional[AuthSpec] = Field(
        None,
        description='HTTP auth for the domains of the seeds, e.g. {scheme = "bearer", '
        'credential = "SHOP_TOKEN"}: each worker reads DISTSCRAPE_CREDENTIAL_SHOP_TOKEN. '
        "fetch.domains gives other domains theirs.",
    )
    proxies: ProxyNames = Field(
        default_factory=list, max_length=100,
        description="Names of the workers' proxies (their DISTSCRAPE_PROXIES setting) that "
        "requests go through, in turn; none: straight to the site.",
    )
    cookies: bool = Field(
        False,
        description="Keep the cookies sites set, in a jar every worker of the job shares, and "
        "send them back as a browser would (RFC 6265).",
    )
    cookies_per_domain: int = Field(
        50, ge=1, le=1000,
        description="Most cookies the jar keeps per cookie domain (the oldest goes first).",
    )
    cookie_bytes: int = Field(
        1024 * 1024, ge=1024, le=64 * 1024 * 1024,
        description="Most bytes the job's jar takes in all; a cookie beyond is not kept.",
    )
    domains: dict[str, DomainFetchSpec] = Field(
        default_factory=dict, max_length=1000,
        description="A domain's own headers, auth and proxies, e.g. "
        '{"shop.example.org" = {auth = {scheme = "basic", credential = "SHOP"}}}.',
    )

    @field_validator("user_agent")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("must be one line of printable characters")
        return value

    @field_validator("domains")
    @classmethod
    def _domains(cls, value: dict[str, DomainFetchSpec]) -> dict[str, DomainFetchSpec]:
        return check_domain_keys(value)


class DomainOverride(StrictModel):
    """One domain's own limits; an unset one is the job's."""

    max_rate: Optional[float] = Field(None, gt=0, le=10000)
    concurrency: Optional[int] = Field(None, ge=1, le=100000)


class PolitenessSpec(StrictModel):
    """How hard the whole cluster may hit each site, how far the job may grow, how failed
    downloads back off. A domain is a URL's host, with ``:port`` if the URL names one; a site is
    what the limits count by (``key``), and every job crawling a site shares its budget."""

    max_rate: Optional[float] = Field(
        None, gt=0, le=10000,
        description="Most requests per second to one domain, across all workers; None: no limit.",
    )
    per_domain_concurrency: int = Field(
        DOMAIN_CONCURRENCY, ge=1, le=100000,
        description="Most requests in flight to one domain, across all workers.",
    )
    domain_overrides: dict[str, DomainOverride] = Field(
        default_factory=dict, max_length=1000,
        description='Per-domain max_rate and concurrency, e.g. {"example.org:8080" = {max_rate = 1}}.',
    )
    key: Literal["host", "ip"] = Field(
        "host",
        description='What max_rate, the in-flight cap and Crawl-delay count by: "host", each '
        'domain; "ip", the address a worker resolves its host to, so host names served by one '
        "address are paced as one.",
    )
    max_pages: Optional[int] = Field(
        None, ge=1, description="Most items the job ever holds (seeds and dead items count)."
    )
    max_pages_per_domain: Optional[int] = Field(None, ge=1, description="The same, per domain.")
    backoff_base: float = Field(
        1.0, gt=0, le=3600,
        description="A retried download waits about base x 2^(failed attempts) seconds (with jitter).",
    )
    backoff_max: float = Field(
        600.0, gt=0, le=86400, description="Longest wait before a retry, Retry-After included."
    )
    max_duration: Optional[float] = Field(
        None, gt=0, le=10 * 365 * 86400,
        description="Seconds the job may run, from its start on the tracker's clock: then it "
        "dispatches nothing more, lets what is in flight finish, and ends expired with its "
        "queued items left queued. None: no limit.",
    )

    @field_validator("domain_overrides")
    @classmethod
    def _domains(cls, value: dict[str, DomainOverride]) -> dict[str, DomainOverride]:
        return check_domain_keys(value)

    @property
    def smallest_concurrency(self) -> int:
        """The lowest in-flight cap of any domain: the job's, or a domain override's."""
        return min([self.per_domain_concurrency,
                    *(o.concurrency for o in self.domain_overrides.values() if o.concurrency)])

    def limits_for(self, override: Optional[DomainOverride] = None) -> DomainLimits:
        """The tracker's limits for a domain with ``override`` (None: any domain without one):
        each value the override leaves unset is the job's."""
        rate = override.max_rate if override and override.max_rate else self.max_rate
        concurrency = override.concurrency if override and override.concurrency else None
        return DomainLimits(
            interval=1.0 / rate if rate else 0.0,
            concurrency=concurrency or self.per_domain_concurrency,
        )


class TrackerSpec(StrictModel):
    """How the job's state is laid out in the tracker's Redis."""

    shards: int = Field(
        1, ge=1, le=1024,
        description="Hash-tag shards the job's frontier and seen set are spread over (by domain), "
        "so that on Redis Cluster the job uses several masters; 1 keeps it in one slot. "
        "max_pages is split evenly over the shards.",
    )


# The built-in priority rules; any other is a function named as "package.module:function".
PRIORITY_RULES = ("breadth-first", "depth-first")
_DOTTED_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class PrioritySpec(StrictModel):
    """How the links a page yields are ranked in their domain's queue: a higher priority is
    dispatched first, equal ones first come, first served. Seeds take theirs from
    ``distscrape seed --priority`` (default 0)."""

    rule: str = Field(
        "breadth-first",
        description='"breadth-first" (every link at 0: each domain\'s queue first in, first '
        'out), "depth-first" (a link\'s priority is its depth, so deeper links go first), or a '
        'function of your own as "package.module:function", called as function(url, depth, '
        "parent_url) and returning an integer from -1000 to 1000.",
    )

    @field_validator("rule")
    @classmethod
    def _rule(cls, value: str) -> str:
        if value in PRIORITY_RULES or _DOTTED_FUNCTION.match(value):
            return value
        raise ValueError(
            f"unknown rule {value!r}: use {', '.join(PRIORITY_RULES)} or a function as "
            "'package.module:function'"
        )
