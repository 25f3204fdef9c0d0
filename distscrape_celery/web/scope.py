"""Which found links a job follows: length, canonical form, hosts or domains, regexes, file
extensions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional
from urllib.parse import urlsplit

from ..job.scraper_spec import DEFAULT_DENY_EXTENSIONS
from ..job.spec import JobSpec
from ..job.patterns import DEFAULT_REGEX_SECONDS, Budget, compile_pattern
from ..job.urls import DEFAULT_MAX_URL_LENGTH, Canonicalizer, url_host


def scope_hosts(spec: JobSpec) -> tuple[Optional[set[str]], Optional[list[str]]]:
    """The hosts (matched exactly) and domains (with their subdomains) ``spec.scraper`` keeps a
    crawl to; both None: any host. By default, the hosts of the job's seeds."""
    s = spec.scraper
    if not s.same_host:
        return None, None
    if s.allowed_domains is not None:
        return None, s.allowed_domains
    return {url_host(url) for url in spec.origin_urls()}, None


class HostScope:
    """The hosts a job may fetch from when a redirect leads elsewhere: those of its link scope
    (:func:`scope_hosts`), the other rules of :class:`LinkScope` aside (a redirect's target is
    the page it was sent for, not a link the job chose to follow)."""

    def __init__(self, hosts: Optional[Iterable[str]] = None,
                 domains: Optional[Iterable[str]] = None) -> None:
        self.hosts = frozenset(h.lower() for h in hosts) if hosts is not None else None
        self.domains = tuple(d.lower() for d in domains) if domains is not None else None

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "HostScope":
        return cls(*scope_hosts(spec))

    @property
    def takes_any(self) -> bool:
        """True when every host is in scope (``scraper.same_host = false``)."""
        return self.hosts is None and self.domains is None

    def takes(self, url: str) -> bool:
        """Whether ``url``'s host is in scope; a URL without a readable host is not."""
        if self.takes_any:
            return True
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:
            return False
        if self.hosts is not None and host not in self.hosts:
            return False
        return self.domains is None or _in_domains(host, self.domains)


class LinkScope:
    """Decides, once per link, whether a job follows it, and in which canonical form.

    A URL longer than ``max_url_length`` characters, as given or canonical, is not followed.
    ``hosts`` are matched exactly, ``domains`` with their subdomains (both None: any host);
    ``allow`` patterns must match if there are any, ``deny`` patterns must not (a search of the
    canonical URL, see :mod:`.patterns`); a path ending in one of ``deny_extensions`` is not
    followed. A page's pattern matching may take ``regex_seconds`` (see :meth:`page_budget`).
    """

    def __init__(
        self,
        canonicalizer: Optional[Canonicalizer] = None,
        *,
        hosts: Optional[Iterable[str]] = None,
        domains: Optional[Iterable[str]] = None,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        deny_extensions: Iterable[str] = DEFAULT_DENY_EXTENSIONS,
        max_url_length: int = DEFAULT_MAX_URL_LENGTH,
        regex_seconds: float = DEFAULT_REGEX_SECONDS,
    ) -> None:
        self.canonicalizer = canonicalizer or Canonicalizer()
        self.max_url_length = max_url_length
        self.regex_seconds = regex_seconds
        self.hosts = frozenset(h.lower() for h in hosts) if hosts is not None else None
        self.domains = tuple(d.lower() for d in domains) if domains is not None else None
        self.allow = [compile_pattern(p) for p in allow]
        self.deny = [compile_pattern(p) for p in deny]
        self.deny_extensions = frozenset(e.lower() for e in deny_extensions)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "LinkScope":
        """The scope ``spec.scraper`` describes; by default, the hosts of the job's seeds."""
        scraper = spec.scraper
        hosts, domains = scope_hosts(spec)
        allow = ([scraper.link_regex] if scraper.link_regex is not None else [])
        allow += scraper.allow_regex
        return cls(
            Canonicalizer(scraper.strip_params), hosts=hosts, domains=domains, allow=allow,
            deny=scraper.deny_regex, deny_extensions=scraper.deny_extensions,
            max_url_length=scraper.max_url_length, regex_seconds=scraper.regex_seconds,
        )

    def page_budget(self) -> Budget:
        """The time the pattern matching of one page may take from now."""
        return Budget(self.regex_seconds)

    def accept(self, url: str, budget: Optional[Budget] = None) -> Optional[str]:
        """``url`` in canonical form if the job follows it, else None. Raises only
        :class:`~distscrape_celery.job.patterns.PatternTimeout`, when the allow and deny patterns
        used up ``budget`` (default: a budget of its own)."""
        # Before the canonicalizer and its cache: an over-long URL costs nothing but this.
        if len(url) > self.max_url_length:
            return None
        try:
            canonical = self.canonicalizer.canonical(url)
        except ValueError:  # mailto:, javascript:, data:, ftp:, malformed
            return None
        found = canonical.url
        if len(found) > self.max_url_length:  # percent-escapes made it longer
            return None
        if self.hosts is not None and canonical.host not in self.hosts:
            return None
        if self.domains is not None and not _in_domains(canonical.host, self.domains):
            return None
        if self.deny_extensions and self._denied_extension(canonical.path):
            return None
        if not (self.allow or self.deny):
            return found
        budget = budget or self.page_budget()
        if self.allow and not any(budget.search(p, found) for p in self.allow):
            return None
        if any(budget.search(p, found) for p in self.deny):
            return None
        return found

    def _denied_extension(self, path: str) -> bool:
        name = path.rpartition("/")[2].lower()
        dot = name.find(".")
        while dot != -1:  # every suffix, so that "tar.gz" matches as well as "gz"
            if name[dot + 1:] in self.deny_extensions:
                return True
            dot = name.find(".", dot + 1)
        return False


def _in_domains(host: str, domains: tuple[str, ...]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)
