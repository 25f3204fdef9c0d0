"""What a job's requests carry, by domain: its extra headers, its credentials (read from the
worker's settings, sent only to the domains the spec gives them for), the proxy each goes
through, and its cookie jar. The pipeline sets the policy of the job around each download
(:func:`fetch_policy`), as it sets the redirect check; :class:`.fetch.Fetcher` applies it to
every request, each redirect hop on its own."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Optional

from pydantic import SecretStr
from urllib3.util import make_headers

from ..errors import ConfigError, DistscrapeError
from ..job.fetch_policy_spec import AuthSpec
from ..job.spec import JobSpec
from ..settings import CREDENTIAL_PREFIX, Settings
from ..tracker.keys import domain_of
from .cookies import CookieStore, JobCookies

_policy: ContextVar[Optional["FetchPolicy"]] = ContextVar("distscrape_fetch_policy", default=None)


@contextmanager
def fetch_policy(policy: Optional["FetchPolicy"]) -> Iterator[None]:
    """Within the block, every :meth:`.fetch.Fetcher.get` follows ``policy`` (None: none)."""
    token = _policy.set(policy)
    try:
        yield
    finally:
        _policy.reset(token)


def current_policy() -> Optional["FetchPolicy"]:
    """The policy :func:`fetch_policy` set for this thread, if any."""
    return _policy.get()


def check_policy_settings(spec: JobSpec, settings: Settings, *, own_workers: bool) -> None:
    """Raise ConfigError, naming the field, for a proxy (or with ``own_workers``, a credential)
    that ``spec`` names and a worker with ``settings`` lacks. Without ``own_workers`` (a seeding
    process, whose settings need not be the workers'), only proxies are checked, and only when
    ``settings`` has any."""
    fetch = spec.fetch
    places = [("fetch", fetch.proxies, fetch.auth)] + [
        (f'fetch.domains."{domain}"', own.proxies or [], own.auth)
        for domain, own in fetch.domains.items()]
    if own_workers or settings.proxies:
        for where, names, _ in places:
            for name in names:
                if name not in settings.proxies:
                    raise ConfigError(
                        f"{where}.proxies: {name!r} is not one of the workers' proxies "
                        f"({', '.join(sorted(settings.proxies)) or 'none'}: "
                        "DISTSCRAPE_PROXIES)")
    if own_workers:
        for where, _, auth in places:
            if auth is not None and auth.credential not in settings.credentials:
                raise ConfigError(
                    f"{where}.auth: credential {auth.credential} is not set: set "
                    f"{CREDENTIAL_PREFIX}{auth.credential}")


class PolicyRefused(DistscrapeError):
    """This worker cannot send a request as the job's policy asks (a credential or proxy it
    lacks): the cause of the :class:`..errors.FetchError` that fails the item; never the host's
    answer."""


@dataclass
class DomainPolicy:
    """What each request to one domain carries. ``error``: why none may be sent (a credential or
    proxy this worker lacks); the item fails with it, and would on every worker like this one."""

    headers: dict[str, str]
    proxies: tuple[tuple[str, str], ...]  # (name, URL), taken in turn
    error: str = ""

    def __post_init__(self) -> None:
        self._turns = itertools.cycle(self.proxies) if self.proxies else None
        self._lock = threading.Lock()

    def next_proxy(self) -> Optional[tuple[str, str]]:
        """The (name, URL) of the proxy the next request goes through, or None: directly."""
        if self._turns is None:
            return None
        with self._lock:
            return next(self._turns)


class FetchPolicy:
    """The fetch policy of one job on this worker: ``proxies`` and ``credentials`` are the
    worker's settings, ``cookies`` the job's shared jar (None: the job keeps no cookies)."""

    def __init__(
        self, spec: JobSpec, *, proxies: Mapping[str, str],
        credentials: Mapping[str, SecretStr], cookies: Optional[JobCookies] = None,
    ) -> None:
        self.spec = spec.fetch
        self.proxies = proxies
        self.credentials = credentials
        self.cookies = cookies
        # The job's auth goes to the domains of the URLs its owner named, and nowhere else.
        self.seed_domains = frozenset(domain_of(url) for url in spec.origin_urls())
        self._domains: dict[str, DomainPolicy] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_job(
        cls, job: str, spec: JobSpec, *, proxies: Mapping[str, str],
        credentials: Mapping[str, SecretStr], cookie_store: Optional[CookieStore],
    ) -> Optional["FetchPolicy"]:
        """The policy of ``job``; None when its spec asks nothing of it (no header, auth, proxy
        or cookie: its requests go as they always did)."""
        fetch = spec.fetch
        if not (fetch.headers or fetch.auth or fetch.proxies or fetch.cookies or fetch.domains):
            return None
        cookies = None
        if fetch.cookies and cookie_store is not None:
            cookies = JobCookies(cookie_store, job, per_domain=fetch.cookies_per_domain,
                                 max_bytes=fetch.cookie_bytes)
        return cls(spec, proxies=proxies, credentials=credentials, cookies=cookies)

    def for_url(self, url: str) -> DomainPolicy:
        """What a request of ``url`` carries (built once per domain)."""
        domain = domain_of(url)
        found = self._domains.get(domain)
        if found is None:
            found = self._build(domain)
            with self._lock:
                if len(self._domains) >= 10_000:  # a broad crawl's many domains: start over
                    self._domains.clear()
                self._domains[domain] = found
        return found

    def _build(self, domain: str) -> DomainPolicy:
        spec = self.spec
        own = spec.domains.get(domain)
        headers = dict(spec.headers)
        if own is not None:
            lowered = {name.lower() for name in own.headers}
            headers = {k: v for k, v in headers.items() if k.lower() not in lowered}
            headers.update(own.headers)
        auth, where = spec.auth if domain in self.seed_domains else None, "fetch.auth"
        if own is not None and own.auth is not None:
            auth, where = own.auth, f'fetch.domains."{domain}".auth'
        names = own.proxies if own is not None and own.proxies is not None else spec.proxies
        try:
            if auth is not None:
                headers.update(self._auth_header(auth, where))
            proxies = tuple((name, self._proxy(name)) for name in names)
        except LookupError as exc:
            return DomainPolicy(headers={}, proxies=(), error=str(exc.args[0]))
        return DomainPolicy(headers=headers, proxies=proxies)

    def _auth_header(self, auth: AuthSpec, where: str) -> dict[str, str]:
        secret = self.credentials.get(auth.credential)
        if secret is None:
            raise LookupError(
                f"credential {auth.credential} ({where}) is not set on this worker: set "
                f"{CREDENTIAL_PREFIX}{auth.credential} in its environment")
        value = secret.get_secret_value()
        if auth.scheme == "bearer":
            return {"Authorization": f"Bearer {value}"}
        if ":" not in value:
            # The value is a secret: the message never repeats it.
            raise LookupError(
                f"credential {auth.credential} ({where}) is not USER:PASSWORD, as basic auth "
                "needs")
        return make_headers(basic_auth=value)

    def _proxy(self, name: str) -> str:
        url = self.proxies.get(name)
        if url is None:
            raise LookupError(
                f"proxy {name!r} (fetch.proxies) is not one of this worker's proxies "
                f"({', '.join(sorted(self.proxies)) or 'none'}; DISTSCRAPE_PROXIES)")
        return url
