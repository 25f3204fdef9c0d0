"""Redis URLs as redis-py reads them: which URLs name a Redis, and whether one is fit to connect
with as written (checked where a setting or a job spec names one, so that a typo is an error that
names it, its password redacted, rather than a connection to the wrong place)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

from .redaction import redact

REDIS_SCHEMES = ("redis", "rediss", "unix")


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis (its scheme; see :func:`check_redis_url` for the rest)."""
    return url.split("://", 1)[0].lower() in REDIS_SCHEMES if "://" in url else False


def check_redis_url(url: str) -> str:
    """Return ``url`` if redis-py can connect with it as written, else raise ValueError naming it
    (its password redacted) and what is wrong: scheme, port, database number."""
    from redis.connection import parse_url

    shown = repr(redact(url))
    if "://" not in url:
        raise ValueError(f"{shown} is not a URL (expected e.g. redis://host:6379/0)")
    after_scheme = url.partition("://")[2]
    if "@" in after_scheme[len(re.split(r"[/?#]", after_scheme, maxsplit=1)[0]):]:
        # A raw '/', '?' or '#' in the password ends the host part early: what follows would be
        # read as a port or a database, and shown in the message below.
        raise ValueError(
            f"invalid Redis URL {shown}: an '@' after the host part; percent-encode '/', '?', "
            "'#' and '@' in the password (%2F, %3F, %23, %40)"
        )
    parts = urlsplit(url)
    if {"password", "username"} & {name.lower() for name, _ in parse_qsl(parts.query)}:
        # redis-py takes them, but kombu (the Celery broker) fails on them with a TypeError.
        raise ValueError(
            f"invalid Redis URL {shown}: give the credentials as user info "
            "(redis://:PASSWORD@host:6379/0 or redis://USER:PASSWORD@host:6379/0), not in the query"
        )
    try:
        parts.port
    except ValueError:
        port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise ValueError(
            f"invalid Redis URL {shown}: the port {port!r} is not a number from 1 to 65535"
        ) from None
    try:
        parse_url(url)
    except ValueError as exc:
        reason = str(exc)
        if "scheme" in reason:
            reason = "the scheme must be redis://, rediss:// or unix://"
        raise ValueError(f"invalid Redis URL {shown}: {reason}") from None
    if parts.scheme in ("redis", "rediss"):
        database = unquote(parts.path).strip("/")
        if database and not database.isdigit():
            # redis-py would silently use database 0 instead.
            raise ValueError(
                f"invalid Redis URL {shown}: the database {database!r} is not a number")
        if not parts.hostname:
            raise ValueError(f"invalid Redis URL {shown}: no host")
    return url
