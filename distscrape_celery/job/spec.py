"""A job's spec: its seeds and how to scrape, fetch and save. Validated once, stored as JSON.

The spec joins its sections (:mod:`.sections` for fetch, politeness and tracker,
:mod:`.scraper_spec`, :mod:`.saver_spec`, :mod:`.extract_spec`); this module holds the whole
spec, the seeds' own check, and how a spec is built from a TOML file and the command line's overrides."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from ..errors import ConfigError, SpecError, format_validation_error, validation_problems
from ..redaction import redact
from ..tracker.keys import NO_DOMAIN, domain_of
from ..tracker.model import CrawlLimits
from .extract_spec import ExtractSpec
from .fetch_policy_spec import POLICY_FIELDS
from .revisit_spec import RevisitSpec
from .saver_spec import SaverSpec
from .schedule import ScheduleSpec
from .scraper_spec import ScraperSpec
from .sections import FetchSpec, PolitenessSpec, PrioritySpec, StrictModel, TrackerSpec, field_label
from .sitemap_spec import SitemapsSpec
from .urls import MAX_URL_CHARS, Canonicalizer, normalize_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# Fields that jobs stored by earlier versions lack, by section (see JobSpec.to_json).
_LATER_FIELDS = {
    "scraper": ("max_url_length", "max_links_per_page", "regex_seconds"),
    "politeness": ("max_duration", "key"),
    "fetch": POLICY_FIELDS,
}


class JobSpec(StrictModel):
    """Everything a worker needs to process a job's items, shared through the tracker."""

    seeds: list[str] = Field(..., min_length=1)
    scraper: ScraperSpec = ScraperSpec()
    saver: SaverSpec = SaverSpec()
    fetch: FetchSpec = FetchSpec()
    politeness: PolitenessSpec = PolitenessSpec()
    tracker: TrackerSpec = TrackerSpec()
    priority: PrioritySpec = PrioritySpec()
    sitemaps: SitemapsSpec = SitemapsSpec()
    revisit: Optional[RevisitSpec] = Field(
        None, description="Keep a record of every saved page, and in each later generation "
        "fetch again only the pages that are due, saving only those that changed.")
    extract: Optional[ExtractSpec] = Field(
        None, description="The records each saved page yields (fields by CSS or XPath, "
        "structured data, a function of your own), for a saver of records.")
    schedule: Optional[ScheduleSpec] = Field(
        None, description="Run the job again on this schedule, each run a new generation. "
        "Kept by the tracker beside the job (distscrape schedule changes it), not in the spec "
        "the workers read.")
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
        items: list[str] = []
        for seed in data["seeds"]:
            if not isinstance(seed, str):
                raise ValueError(f"seed {seed!r} is not a string")
            item = seed_item(seed, kind, canonicalizer)
            if item not in items:
                items.append(item)
        return {**data, "seeds": items}

    @field_validator("sitemaps")
    @classmethod
    def _sitemaps_need_urls(cls, value: SitemapsSpec, info: ValidationInfo) -> SitemapsSpec:
        scraper = info.data.get("scraper")
        if value.enabled and isinstance(scraper, ScraperSpec) and scraper.kind == "ids":
            raise ValueError(
                f"mode {value.mode!r} needs a scraper of URLs, and the ids scraper "
                f"({field_label(info, 'scraper.kind')}) reads no sitemap"
            )
        return value

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
        exclude["schedule"] = True
        if self.revisit is None:
            exclude["revisit"] = True
        if self.extract is None:
            exclude["extract"] = True
        if self.sitemaps == SitemapsSpec():
            exclude["sitemaps"] = True
        if self.priority == PrioritySpec():
            exclude["priority"] = True
        for section, names in _LATER_FIELDS.items():
            model = getattr(self, section)
            fields = type(model).model_fields
            later = {name for name in names if getattr(model, name)
                     == fields[name].get_default(call_default_factory=True)}
            if later:
                exclude[section] = later
        return self.model_dump_json(exclude=exclude)

    def crawl_limits(self) -> CrawlLimits:
        """The limits the tracker enforces for this job."""
        politeness = self.politeness
        download_fmt = self.scraper.download_url_fmt
        return CrawlLimits(
            default=politeness.limits_for(),
            overrides={domain: politeness.limits_for(override)
                       for domain, override in politeness.domain_overrides.items()},
            max_pages=politeness.max_pages,
            max_pages_per_domain=politeness.max_pages_per_domain,
            id_domain=domain_of(download_fmt.format("x", id="x")) if download_fmt else NO_DOMAIN,
            shards=self.tracker.shards,
            max_duration=politeness.max_duration,
            pace=politeness.key,
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
        raise SpecError("invalid job spec: " + format_validation_error(exc, names=names),
                        validation_problems(exc, names=names)) from None


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
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            continue
        if isinstance(value, dict):
            base_value = merged.get(key)
            merged[key] = merge(base_value if isinstance(base_value, dict) else {}, value)
        else:
            merged[key] = value
    return merged
