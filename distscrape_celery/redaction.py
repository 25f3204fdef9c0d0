"""Secrets kept out of what the program prints and logs: every configured URL (Redis, broker,
output) is shown through :func:`redact`."""

from __future__ import annotations

import re

MASK = "***"
# A query parameter whose name holds one of these (any case) carries a secret: redis-py reads
# ?password=, other services ?token=, ?api_key=, ?sig=...
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|auth|key|credential|sig", re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` fit to be shown: the password of its user info (or the whole user info, when it
    has no password: a lone user may be a token) and the values of query parameters that name a
    secret replaced by ``***``. Works on malformed URLs; text without ``://`` is returned as is."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # The user info ends at the last '@', not at the first '/': a password may hold a raw '/',
    # '?', '#', ':' or '@'. Reading it so may hide more than the password, never less.
    userinfo, at, rest = rest.rpartition("@")
    shown = ""
    if at:
        user, colon, _ = userinfo.partition(":")
        shown = f"{user}:{MASK}@" if colon and not re.search(r"[/?#]", user) else f"{MASK}@"
    base, question, query = rest.partition("?")
    if question:
        query = "&".join(_redact_param(pair) for pair in query.split("&"))
    return f"{scheme}://{shown}{base}{question}{query}"


def _redact_param(pair: str) -> str:
    name, equals, _ = pair.partition("=")
    return f"{name}={MASK}" if equals and _SECRET_PARAM.search(name) else pair
