"""A job's spec: its seeds and how to scrape, fetch and save. Validated once, stored as JSON."""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from pydantic import (
    BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator,
)

from ..errors import ConfigError, format_validation_error
from ..tracker.keys import NO_DOMAIN, domain_of
from .patterns import DEFAULT_REGEX_SECONDS, compile_pattern
from ..redaction import redact
from ..redis_urls import is_redis_url
from ..tracker.model import CrawlLimits, DomainLimits
from .urls import (
    DEFAULT_MAX_URL_LENGTH, DEFAULT_TRACKING_PARAMS, MAX_URL_CHARS, Canonicalizer, host_name_error,
    normalize_url,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FetchSpec(_Strict):
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

    @field_validator("user_agent")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("must be one line of printable characters")
        return value


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

_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _check_kind(value: str, builtin: tuple[str, ...]) -> str:
    if value in builtin or _DOTTED.match(value):
        return value
    raise ValueError(
        f"unknown kind {value!r}: use one of {', '.join(builtin)} or a class as 'package.module:Class'"
    )


class ScraperSpec(_Strict):
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

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return _check_kind(value, ("simple", "ids"))

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
                _label(info, f"scraper.{n}", n) for n in ("id_regex", "download_url_fmt")
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


def _label(info: ValidationInfo, field: str, default: Optional[str] = None) -> str:
    """How the person who wrote the spec calls ``field`` (an option such as ``--id-regex``)."""
    names = (info.context or {}).get("names") or {}
    return names.get(field, default or field)


# The built-in savers by what their output looks like; anything else is a directory (files).
TAR_EXTENSIONS = (".tar", ".tar.gz", ".tar.bz2")
WARC_EXTENSIONS = (".warc.gz",)


def saver_kind_for(output: str) -> str:
    """The built-in saver an output names: a Redis URL -> redis, a .tar/.tar.gz/.tar.bz2 name ->
    tar, a .warc.gz name -> warc, anything else (a directory) -> files."""
    if is_redis_url(output):
        return "redis"
    if output.endswith(TAR_EXTENSIONS):
        return "tar"
    if output.endswith(WARC_EXTENSIONS):
        return "warc"
    return "files"


_OUTPUT_SHAPES = {
    "files": "a directory",
    "redis": "a redis://, rediss:// or unix:// URL",
    "tar": "a file name ending with " + ", ".join(TAR_EXTENSIONS),
    "warc": "a file name ending with " + " or ".join(WARC_EXTENSIONS),
}


class SaverSpec(_Strict):
    """Which saver stores downloaded items, and its options."""

    kind: str = Field(
        "files",
        description='"files", "redis", "tar", "warc", or a custom ItemSaver class as '
        '"package.module:Class"; when not given, the built-in saver the output names.',
    )
    output: str = Field(
        "crawl-output",
        description="files: a directory; tar: a .tar, .tar.gz or .tar.bz2 name; warc: a .warc.gz "
        "name (shards are named after it); redis: a redis:// or rediss:// URL (made absolute "
        "when seeded, unless a URL).",
    )
    name_scheme: str = Field(
        "{host}/{path}",
        description="files and tar: file or member name; fields {host} {port} {path} {query} "
        "{qhash} {sha1} {shard} {job}; every part is sanitised so no name leaves the output.",
    )
    key_scheme: str = Field(
        "ds:out:{job}:{sha1}",
        description="redis: the key of each item's hash; fields {job} {item} {sha1}.",
    )
    ttl_seconds: Optional[float] = Field(
        None, gt=0, description="redis: keys expire after this long; None: never."
    )
    shard_max_bytes: int = Field(
        1024**3, gt=0, description="tar and warc: start a new shard past this size."
    )
    shard_max_items: Optional[int] = Field(
        None, gt=0, description="tar and warc: start a new shard past this many items."
    )
    fsync: bool = Field(
        True,
        description="fsync each write before the item counts as done, so a power cut of the "
        "worker host loses nothing; false skips the disk flushes (with group_commit, two a save "
        "batch: on a slow disk that is time, on the benchmark's no measurable speed) and survives "
        "only crashes of the worker process.",
    )
    group_commit: bool = Field(
        True,
        description="files, with fsync: make a save batch's files durable together, with two "
        "syncfs calls for the batch instead of two fsyncs per file. syncfs flushes everything the "
        "output's file system holds dirty: false where other programs write much to it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_from_output(cls, data: Any) -> Any:
        """No kind given: the one the output names (see :func:`saver_kind_for`)."""
        if isinstance(data, dict) and data.get("kind") is None:
            output = data.get("output")
            return {**data, "kind": saver_kind_for(output if isinstance(output, str) else "")}
        return data

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return _check_kind(value, tuple(_OUTPUT_SHAPES))

    @field_validator("output")
    @classmethod
    def _output_suits_kind(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind in _OUTPUT_SHAPES and (
            saver_kind_for(value) != kind
            # An archive's shards are named after its stem, so it needs one.
            or (kind in ("tar", "warc") and os.path.basename(value).startswith("."))
        ):
            raise ValueError(
                f"{redact(value)!r} is not an output for the {kind} saver "
                f"({_label(info, 'saver.kind')}), which takes {_OUTPUT_SHAPES[kind]}"
            )
        return value


# A key of domain_overrides: a domain as keys.domain_of gives it, an authority without user info.
_HOST_PORT = re.compile(r"(?:[a-z0-9._~%!$&'()*+,;=-]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


class DomainOverride(_Strict):
    """One domain's own limits; an unset one is the job's."""

    max_rate: Optional[float] = Field(None, gt=0, le=10000)
    concurrency: Optional[int] = Field(None, ge=1, le=100000)


class PolitenessSpec(_Strict):
    """How hard the whole cluster may hit each domain, how far the job may grow, how failed
    downloads back off. A domain is a URL's host, with ``:port`` if the URL names one."""

    max_rate: Optional[float] = Field(
        None, gt=0, le=10000,
        description="Most requests per second to one domain, across all workers; None: no limit.",
    )
    per_domain_concurrency: int = Field(
        8, ge=1, le=100000, description="Most requests in flight to one domain, across all workers."
    )
    domain_overrides: dict[str, DomainOverride] = Field(
        default_factory=dict, max_length=1000,
        description='Per-domain max_rate and concurrency, e.g. {"example.org:8080" = {max_rate = 1}}.',
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

    @field_validator("domain_overrides")
    @classmethod
    def _domains(cls, value: dict[str, DomainOverride]) -> dict[str, DomainOverride]:
        out = {}
        for domain, override in value.items():
            key = domain.lower()
            if not _HOST_PORT.fullmatch(key):
                raise ValueError(f"{domain!r} is not a host or host:port")
            out[key] = override
        return out

    @property
    def smallest_concurrency(self) -> int:
        """The lowest in-flight cap of any domain: the job's, or a domain override's."""
        return min([self.per_domain_concurrency,
                    *(o.concurrency for o in self.domain_overrides.values() if o.concurrency)])

    def limits_for(self, override: Optional[DomainOverride] = None) -> DomainLimits:
        rate = override.max_rate if override and override.max_rate else self.max_rate
        concurrency = override.concurrency if override and override.concurrency else None
        return DomainLimits(
            interval=1.0 / rate if rate else 0.0,
            concurrency=concurrency or self.per_domain_concurrency,
        )


class TrackerSpec(_Strict):
    """How the job's state is laid out in the tracker's Redis."""

    shards: int = Field(
        1, ge=1, le=1024,
        description="Hash-tag shards the job's frontier and seen set are spread over (by domain), "
        "so that on Redis Cluster the job uses several masters; 1 keeps it in one slot. "
        "max_pages is split evenly over the shards.",
    )


# Scraper fields that jobs stored by earlier versions lack (see JobSpec.to_json).
_LATER_SCRAPER_FIELDS = ("max_url_length", "max_links_per_page", "regex_seconds")


class JobSpec(_Strict):
    """Everything a worker needs to process a job's items, shared through the tracker."""

    seeds: list[str] = Field(..., min_length=1)
    scraper: ScraperSpec = ScraperSpec()
    saver: SaverSpec = SaverSpec()
    fetch: FetchSpec = FetchSpec()
    politeness: PolitenessSpec = PolitenessSpec()
    tracker: TrackerSpec = TrackerSpec()
    max_retries: int = Field(
        3, ge=0, le=100,
        description="Failed attempts that were the item's fault (its download or save raised) "
        "before it is dead.",
    )
    max_lost: int = Field(
        10, ge=0, le=1000,
        description="Times the worker holding an item may vanish (killed, hung, cut off; or its "
        "save message or staged body lost) before the item is dead. Larger than max_retries: "
        "such losses are rarely the item's fault, but a page that kills every worker that takes "
        "it must still end.",
    )

    @model_validator(mode="before")
    @classmethod
    def _seed_items(cls, data: Any) -> Any:
        """Seeds are URLs, canonicalized as found links are; with the ids scraper they may also
        be IDs, kept as given."""
        if not isinstance(data, dict) or not isinstance(data.get("seeds"), list):
            return data
        scraper = data.get("scraper", ScraperSpec())
        if isinstance(scraper, dict):
            try:
                scraper = ScraperSpec.model_validate(scraper)
            except ValidationError:
                return data  # reported by the field's own validation, under its name
        if not isinstance(scraper, ScraperSpec):
            return data
        kind = scraper.kind
        canonicalizer = Canonicalizer(scraper.strip_params)
        out: list[str] = []
        for seed in data["seeds"]:
            if not isinstance(seed, str):
                raise ValueError(f"seed {seed!r} is not a string")
            item = seed_item(seed, kind, canonicalizer)
            if item not in out:
                out.append(item)
        return {**data, "seeds": out}

    def origin_urls(self) -> list[str]:
        """The URLs the job's owner named: its URL seeds, and the ids scraper's download URL."""
        urls = [seed for seed in self.seeds if "://" in seed]
        if self.scraper.download_url_fmt is not None:
            urls.append(normalize_url(self.scraper.download_url_fmt.format("0", id="0")))
        return urls

    def to_json(self) -> str:
        # An unsharded job's spec stays as it was before shards existed, and fields added later
        # are left out while at their default, so jobs stored before still take new seeds (a
        # spec that differs is a conflict).
        exclude: dict[str, Any] = {"tracker": True} if self.tracker.shards == 1 else {}
        later = {
            name for name in _LATER_SCRAPER_FIELDS
            if getattr(self.scraper, name) == ScraperSpec.model_fields[name].default
        }
        if later:
            exclude["scraper"] = later
        return self.model_dump_json(exclude=exclude or None)

    def crawl_limits(self) -> CrawlLimits:
        """The limits the tracker enforces for this job."""
        p = self.politeness
        fmt = self.scraper.download_url_fmt
        return CrawlLimits(
            default=p.limits_for(),
            overrides={d: p.limits_for(o) for d, o in p.domain_overrides.items()},
            max_pages=p.max_pages, max_pages_per_domain=p.max_pages_per_domain,
            id_domain=domain_of(fmt.format("x", id="x")) if fmt else NO_DOMAIN,
            shards=self.tracker.shards,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> "JobSpec":
        return cls.model_validate_json(text)


# IDs and URLs travel through the broker and the tracker; one this long is junk or an attack.
MAX_ID_CHARS = 256
# IDs that escaping leaves as they are, and that a URL's path would resolve (climb) as a segment.
DOT_IDS = frozenset({".", ".."})


def seed_item(
    seed: str, scraper_kind: Optional[str], canonicalizer: Optional[Canonicalizer] = None
) -> str:
    """The item a seed stands for: a normalised URL, or with the ids scraper an ID (stripped,
    printable, at most 256 characters, not ``.`` or ``..``) unless it is a URL. Raises
    ValueError saying why not."""
    if scraper_kind == "ids" and "://" not in seed:
        item = seed.strip()
        if not item or not item.isprintable():
            raise ValueError(f"malformed seed ID {_shown(seed)}: empty or not printable")
        if len(item) > MAX_ID_CHARS:
            raise ValueError(f"malformed seed ID {_shown(seed)}: longer than {MAX_ID_CHARS} characters")
        if item in DOT_IDS:
            raise ValueError(f"malformed seed ID {_shown(seed)}: cannot be a path segment")
        return item
    if len(seed) > MAX_URL_CHARS:
        raise ValueError(f"malformed seed URL {_shown(seed)}: longer than {MAX_URL_CHARS} characters")
    try:
        return normalize_url(seed, canonicalizer)
    except ValueError as exc:
        raise ValueError(f"malformed seed URL {_shown(seed)}: {exc}") from None


def _shown(value: str, limit: int = 100) -> str:
    """``value`` quoted for an error message, its secrets redacted, cut short: a bad line may be
    megabytes long."""
    value = redact(value)
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."


def build_spec(data: dict[str, Any], names: Optional[dict[str, str]] = None) -> JobSpec:
    """Validate ``data`` into a :class:`JobSpec`; errors name the bad field, as ``names`` calls
    it (a dotted field such as ``scraper.id_regex`` -> ``--id-regex``) where it has it."""
    try:
        return JobSpec.model_validate(data, context={"names": names or {}})
    except ValidationError as exc:
        raise ConfigError("invalid job spec: " + format_validation_error(exc, names=names)) from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML job file into a plain dict (validated later, together with CLI overrides)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (None values in ``override`` are skipped)."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            continue
        if isinstance(value, dict):
            base_value = out.get(key)
            out[key] = merge(base_value if isinstance(base_value, dict) else {}, value)
        else:
            out[key] = value
    return out
