"""The scraper section of a job spec: which scraper finds new items, which links it follows, and
the bounds on a page's links and patterns."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Optional
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .patterns import DEFAULT_REGEX_SECONDS, compile_pattern
from .sections import StrictModel, check_kind, field_label
from .urls import (
    DEFAULT_MAX_URL_LENGTH, DEFAULT_TRACKING_PARAMS, MAX_URL_CHARS, host_name_error, normalize_url,
)


# Links to files a crawler has no use for (Scrapy's IGNORED_EXTENSIONS, without js).
DEFAULT_DENY_EXTENSIONS: tuple[str, ...] = (
    "7z", "7zip", "bz2", "rar", "tar", "tar.gz", "xz", "zip", "gz", "tgz",
    "mng", "pct", "bmp", "gif", "jpg", "jpeg", "png", "pst", "psp", "tif", "tiff", "ai", "drw",
    "dxf", "eps", "ps", "svg", "cdr", "ico", "webp", "avif", "heic",
    "mp3", "wma", "ogg", "wav", "ra", "aac", "mid", "au", "aiff", "flac", "opus",
    "3gp", "asf", "asx", "avi", "mov", "mp4", "mpg", "mpeg", "qt", "rm", "swf", "wmv", "m4a",
    "m4v", "flv", "webm", "mkv",
    "xls", "xlsm", "xlsx", "xltm", "xltx", "potm", "potx", "ppt", "pptm", "pptx", "pps", "doc",
    "docb", "docm", "docx", "dotm", "dotx", "odt", "ods", "odg", "odp",
    "css", "pdf", "exe", "bin", "rss", "dmg", "iso", "apk", "jar", "msi", "deb", "rpm",
    "woff", "woff2", "ttf", "otf", "eot",
)

# The default of scraper.max_links_per_page.
DEFAULT_MAX_LINKS_PER_PAGE = 10_000
# A page's hrefs looked at (resolved and checked against the scope) are at most this many times
# its max_links_per_page: room for every link to be written twice (a title and an image) with
# as many repeats, menus and off-site links again, while a page of 150,000 off-site or repeated
# links costs no more than twice the cap's work. Past it the rest of the page's links are
# counted, not resolved.
HREFS_LOOKED_AT_PER_LINK = 2


class ScraperSpec(StrictModel):
    """Which scraper finds new items, and its options."""

    kind: str = Field(
        "simple", description='"simple", or a custom Scraper class as "package.module:Class".'
    )
    link_regex: Optional[str] = Field(
        None, description="Follow only links whose canonical URL matches this or one of "
        "allow_regex (a search, by the regex package); None: all."
    )
    same_host: bool = Field(
        True,
        description="Follow only links to the seeds' hosts (or to allowed_domains, if given); "
        "false: any host.",
    )
    allowed_domains: Optional[list[str]] = Field(
        None,
        description="Follow only links to these domains and their subdomains; None: the seeds' "
        "hosts exactly.",
    )
    allow_regex: list[str] = Field(
        [], description="Follow only links whose canonical URL matches one of these (a search)."
    )
    deny_regex: list[str] = Field(
        [], description="Never follow links whose canonical URL matches one of these (a search)."
    )
    deny_extensions: list[str] = Field(
        list(DEFAULT_DENY_EXTENSIONS),
        description="Never follow links whose path ends in one of these extensions (no dot, "
        "case-insensitive).",
    )
    max_depth: Optional[int] = Field(
        None, ge=0, description="Follow links only this many hops from a seed (0: the seeds "
        "only); None: no limit.",
    )
    strip_params: list[str] = Field(
        list(DEFAULT_TRACKING_PARAMS),
        description="Query parameters dropped from every URL (names or fnmatch patterns), so "
        "that tracking parameters do not make one page many items.",
    )
    allowed_content_types: Optional[list[str]] = Field(
        None,
        description="Keep only downloads of these media types (fnmatch patterns such as "
        "'text/*'); others end dead before their body is read. None: any type.",
    )
    id_regex: Optional[str] = Field(
        None,
        description="ids scraper: IDs are the matches of this regex (its first group, if it "
        "has one) in every downloaded body.",
    )
    download_url_fmt: Optional[str] = Field(
        None,
        description="ids scraper: the URL an ID is downloaded from, with {} or {id} for the ID "
        "(percent-escaped).",
    )
    max_url_length: int = Field(
        DEFAULT_MAX_URL_LENGTH, ge=1, le=MAX_URL_CHARS,
        description="Never follow a link longer than this many characters, as written in the "
        "page or in canonical form: a longer href is dropped before it is resolved or cached.",
    )
    max_links_per_page: int = Field(
        DEFAULT_MAX_LINKS_PER_PAGE, ge=1, le=1_000_000,
        description="Most distinct items (links, or IDs) one page adds to the job; the rest are "
        "cut, which the worker logs and the job's status counts (links_cut). Link extraction "
        f"stops there, and after {HREFS_LOOKED_AT_PER_LINK} times this many of the page's links "
        "have been looked at: the rest are counted as cut, not resolved.",
    )
    regex_seconds: float = Field(
        DEFAULT_REGEX_SECONDS, gt=0, le=60,
        description="Most time one page's link_regex, allow_regex, deny_regex or id_regex "
        "matching may take; past it the page's link or ID extraction ends, keeping what it found "
        "(the page is still saved), and the worker logs why.",
    )

    obey_noindex: bool = Field(
        True,
        description="A page whose robots meta tag or X-Robots-Tag header says noindex (or "
        "none) is not saved: it counts as done, and among them as noindex.",
    )
    obey_nofollow: bool = Field(
        True,
        description="A page whose robots meta tag or X-Robots-Tag header says nofollow (or "
        "none) adds none of its links.",
    )
    obey_rel_nofollow: bool = Field(
        False, description='Skip the links (<a>, <area>) whose rel says "nofollow".',
    )
    dedupe_canonical: bool = Field(
        False,
        description="A page whose canonical URL (<link rel=canonical>, or a Link header) is "
        "another URL the job follows is not saved (it counts as done, and among them as "
        "canonical); its canonical URL is queued instead, as a link of the page.",
    )

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return check_kind(value, ("simple", "ids"))

    @field_validator("link_regex", "id_regex", "allow_regex", "deny_regex")
    @classmethod
    def _compiles(cls, value: Any) -> Any:
        for pattern in value if isinstance(value, list) else [value]:
            if pattern is not None:
                compile_pattern(pattern)  # its ValueError names the pattern and the problem
        return value

    @field_validator("allowed_domains")
    @classmethod
    def _domains(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        return None if value is None else [allowed_domain(domain) for domain in value]

    @field_validator("deny_extensions")
    @classmethod
    def _extensions(cls, value: list[str]) -> list[str]:
        return [ext.strip().lstrip(".").lower() for ext in value if ext.strip().lstrip(".")]

    @field_validator("download_url_fmt")
    @classmethod
    def _formats(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            probe = value.format("ID", id="ID")
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(
                f"{value!r} is not a URL template with {{}} or {{id}} for the ID: {exc}"
            ) from None
        if probe == value:
            raise ValueError(f"{value!r} has no {{}} or {{id}} where the ID goes")
        try:
            normalize_url(probe)
        except ValueError as exc:
            raise ValueError(f"{value!r} does not make a URL: {exc}") from None
        return value

    @model_validator(mode="after")
    def _ids_needs_both(self, info: ValidationInfo) -> "ScraperSpec":
        if self.kind == "ids" and (self.id_regex is None or self.download_url_fmt is None):
            missing = [
                field_label(info, f"scraper.{n}", n) for n in ("id_regex", "download_url_fmt")
                if getattr(self, n) is None
            ]
            raise ValueError(f"the ids scraper needs {' and '.join(missing)}")
        if self.allowed_domains is not None and not self.same_host:
            raise ValueError("allowed_domains and same_host = false (--all-hosts) exclude each other")
        return self


def allowed_domain(domain: str) -> str:
    """``domain`` as link hosts are compared with it (lower case, IDNA-encoded, no dot at either
    end; an IPv6 address compressed), or ValueError saying why no link host could ever match it:
    a port, a wildcard, a percent-escape, an empty label, a character no host name has."""
    name = domain.strip().strip(".").lower()
    shown = f"{domain!r} is not a domain name"
    if not name:
        raise ValueError(f"{shown}: empty")
    if "/" in name:
        raise ValueError(f"{shown} (no scheme, port or path)")
    if ":" in name:
        try:
            return str(ipaddress.IPv6Address(name.removeprefix("[").removesuffix("]")))
        except ValueError:
            raise ValueError(f"{shown}: no port (a domain takes every port)") from None
    if not name.isascii() and re.search(r"[\s@?#\\%*]", name) is None:
        try:  # encoded as the canonicalizer encodes the host of a link
            name = urlsplit(normalize_url(f"http://{name}/")).hostname or ""
        except ValueError:
            raise ValueError(f"{shown}: not a host name") from None
    why = host_name_error(name)
    if why is not None:
        raise ValueError(f"{shown}: {why}")
    return name
