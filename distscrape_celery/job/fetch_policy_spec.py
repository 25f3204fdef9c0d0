"""What a job sends with its requests, for all of its domains or for one: extra headers, the
credential its requests authenticate with (named, never given: each worker reads it from its
own environment), and the operator's proxies it goes through (named, never given). The job's
``[fetch]`` section (:class:`.sections.FetchSpec`) holds these, and ``[fetch.domains."<host>"]``
a domain's own."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field, field_validator

from ..settings import CREDENTIAL_NAME, PROXY_NAME
from .strict import StrictModel

# The fields of [fetch] that make its policy (besides its limits): all of them at their defaults,
# a job's requests go as they always did.
POLICY_FIELDS = ("headers", "auth", "proxies", "cookies", "cookies_per_domain", "cookie_bytes",
                 "domains")
# A header name: an RFC 9110 token.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A header value: visible ASCII, spaces and tabs, and the octets above 127 (obs-text, sent as
# latin-1); never CR, LF, NUL or another control character, which would end or split the header.
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
MAX_HEADERS = 64
MAX_HEADER_CHARS = 8192
# Headers a spec may not set, by what sets them instead: the connection's framing and hops are
# the HTTP client's, the user agent is fetch.user_agent (matched against robots.txt), and a
# credential is never written in a spec (it would be stored in Redis): fetch.auth names one.
_REFUSED_HEADERS = {
    **dict.fromkeys(
        ("host", "content-length", "transfer-encoding", "connection", "keep-alive",
         "proxy-connection", "te", "trailer", "upgrade", "expect"),
        "the HTTP client sets it"),
    "user-agent": "use fetch.user_agent",
    "authorization": "use auth, which names a credential each worker reads from its environment",
    "cookie": "a cookie may be a credential; use cookies = true, which keeps what sites set",
    "proxy-authorization": "a proxy's credentials are the workers' proxies setting",
}
# A key of a per-domain table: a domain as keys.domain_of gives it, an authority without user
# info (host, or host:port).
_HOST_PORT = re.compile(r"(?:[a-z0-9._~%!$&'()*+,;=-]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


def check_headers(value: dict[str, str]) -> dict[str, str]:
    """``value`` if every header in it may be sent as the spec gives it; else ValueError naming
    the header and why not. Names are matched in any case, and one given twice is refused."""
    if len(value) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    for name, text in value.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name")
        lower = name.lower()
        if lower in seen:
            raise ValueError(f"header {name!r} is given twice")
        seen.add(lower)
        if lower in _REFUSED_HEADERS:
            raise ValueError(f"header {name!r} may not be set here: {_REFUSED_HEADERS[lower]}")
        if lower.startswith("proxy-"):
            raise ValueError(f"header {name!r} may not be set here: it is for the proxy")
        if len(text) > MAX_HEADER_CHARS or not _FIELD_VALUE.fullmatch(text):
            raise ValueError(
                f"header {name!r}: the value must be one line of at most {MAX_HEADER_CHARS} "
                "printable characters")
    return value


def check_domain_keys(value: dict) -> dict:
    """``value`` with its keys lowered, each a ``host`` or ``host:port``; else ValueError."""
    checked = {}
    for domain, entry in value.items():
        key = domain.lower()
        if not _HOST_PORT.fullmatch(key):
            raise ValueError(f"{domain!r} is not a host or host:port")
        if key in checked:
            raise ValueError(f"{domain!r} is given twice")
        checked[key] = entry
    return checked


class AuthSpec(StrictModel):
    """HTTP authentication with a credential each worker holds: ``bearer`` sends
    ``Authorization: Bearer <credential>``, ``basic`` sends the credential (``user:password``)
    as HTTP basic auth. The spec names the credential; its value never leaves the workers."""

    scheme: Literal["basic", "bearer"]
    credential: str = Field(
        ..., description="Read by each worker from DISTSCRAPE_CREDENTIAL_<credential>.")

    @field_validator("credential")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CREDENTIAL_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a credential name: upper-case letters, digits and '_', "
                "starting with a letter (the worker reads DISTSCRAPE_CREDENTIAL_<name>)")
        return value


def check_proxy_names(value: list[str]) -> list[str]:
    """``value`` if each entry may name a proxy and none is given twice; else ValueError."""
    for name in value:
        if not PROXY_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a proxy name")
    if len(set(value)) != len(value):
        raise ValueError("a proxy is named twice")
    return value


# The field types of what a job, or one of its domains, sends: checked the same in both places.
Headers = Annotated[dict[str, str], AfterValidator(check_headers)]
ProxyNames = Annotated[list[str], AfterValidator(check_proxy_names)]


class DomainFetchSpec(StrictModel):
    """What one domain's requests send beyond the job's: its headers are added to the job's
    (replacing one of the same name), its ``auth`` and ``proxies``, when set, are used instead
    of the job's."""

    headers: Headers = Field(default_factory=dict)
    auth: Optional[AuthSpec] = None
    proxies: Optional[ProxyNames] = Field(
        None, max_length=100,
        description="The proxies (names of the workers' proxies setting) this domain's requests "
        "go through, in turn; [] for none, even where the job names some.")
