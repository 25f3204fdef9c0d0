"""Which found links a job follows: canonical form, hosts or domains, regexes, file extensions."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional

from .jobspec import DEFAULT_DENY_EXTENSIONS, JobSpec
from .urls import MAX_URL_CHARS, Canonicalizer, url_host


class LinkScope:
    """Decides, once per link, whether a job follows it, and in which canonical form.

    ``hosts`` are matched exactly, ``domains`` with their subdomains (both None: any host);
    ``allow`` patterns must match if there are any, ``deny`` patterns must not (``re.search`` on
    the canonical URL); a path ending in one of ``deny_extensions`` is not followed.
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
    ) -> None:
        self.canonicalizer = canonicalizer or Canonicalizer()
        self.hosts = frozenset(h.lower() for h in hosts) if hosts is not None else None
        self.domains = tuple(d.lower() for d in domains) if domains is not None else None
        self.allow = [re.compile(p) for p in allow]
        self.deny = [re.compile(p) for p in deny]
        self.deny_extensions = frozenset(e.lower() for e in deny_extensions)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "LinkScope":
        """The scope ``spec.scraper`` describes; by default, the hosts of the job's seeds."""
        s = spec.scraper
        hosts = domains = None
        if s.same_host:
            if s.allowed_domains is not None:
                domains = s.allowed_domains
            else:
                hosts = {url_host(url) for url in spec.origin_urls()}
        allow = ([s.link_regex] if s.link_regex is not None else []) + s.allow_regex
        return cls(
            Canonicalizer(s.strip_params), hosts=hosts, domains=domains, allow=allow,
            deny=s.deny_regex, deny_extensions=s.deny_extensions,
        )

    def accept(self, url: str) -> Optional[str]:
        """``url`` in canonical form if the job follows it, else None. Never raises."""
        try:
            canonical = self.canonicalizer.canonical(url)
        except ValueError:  # mailto:, javascript:, data:, ftp:, malformed
            return None
        found = canonical.url
        if len(found) > MAX_URL_CHARS:
            return None
        if self.hosts is not None and canonical.host not in self.hosts:
            return None
        if self.domains is not None and not _in_domains(canonical.host, self.domains):
            return None
        if self.deny_extensions and self._denied_extension(canonical.path):
            return None
        if self.allow and not any(p.search(found) for p in self.allow):
            return None
        if any(p.search(found) for p in self.deny):
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
