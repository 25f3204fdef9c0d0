"""The options that describe a job's spec, shared by ``seed`` and ``crawl``, and how their values
(over a --config file) become a checked :class:`JobSpec` whose errors name the flag at fault."""

from __future__ import annotations

import functools
from typing import Any

import click

from ..job.spec import JobSpec, load_config_file, merge
from ..settings import Settings

spec_options = [
    click.option("--link-regex", metavar="REGEX", help="Follow only links whose URL matches."),
    click.option("--output", metavar="PATH",
                 help="Where items are saved: a directory, a .tar/.tar.gz/.tar.bz2 or .warc.gz "
                      "name, a .jsonl/.jsonl.gz name (the records of a job whose --config has "
                      "[extract]), or a redis:// URL (default ./crawl-output)."),
    click.option("--config", type=click.Path(dir_okay=False), help="TOML job file."),
    click.option("--all-hosts", is_flag=True, help="Follow links to any host, not only the seeds'."),
]
scraper_saver_options = [
    click.option("--scraper", metavar="simple|ids|MODULE:CLASS",
                 help="What finds new items: links (simple, the default), IDs (ids), or a "
                      "Scraper class of your own, from a module that DISTSCRAPE_PLUGIN_MODULES "
                      "allows (in the workers' settings and this command's)."),
    click.option("--id-regex", metavar="REGEX",
                 help="ids scraper: new IDs are this regex's matches (its first group, if any)."),
    click.option("--download-url-fmt", metavar="URL",
                 help="ids scraper: the URL an ID is downloaded from, with {id} for the ID."),
    click.option("--saver", metavar="files|redis|tar|warc|jsonl|postgres|MODULE:CLASS",
                 help="How items are saved (default: the saver --output names: a redis:// URL "
                      "redis, a .tar* name tar, a .warc.gz name warc, a .jsonl* name jsonl, else "
                      "files), or a class of your own, as for --scraper."),
]
# What a job fetches and how (see docs/configuration.md, Crawl policy).
policy_options = [
    click.option("--ignore-robots", is_flag=True, help="Fetch what robots.txt disallows."),
    click.option("--user-agent", metavar="UA", help="User-Agent header, also matched in robots.txt."),
    click.option("--max-depth", type=click.IntRange(0), metavar="N",
                 help="Follow links at most N hops from a seed (0: the seeds only)."),
    click.option("--allow-domain", "allow_domains", multiple=True, metavar="DOMAIN",
                 help="Follow links to DOMAIN and its subdomains (repeatable; default: the "
                      "seeds' hosts)."),
    click.option("--allow-private", is_flag=True,
                 help="Let links reach private, loopback and link-local addresses (by default "
                      "only the address and port a seed gives literally, an IP address or "
                      "localhost, and only by that literal, never by a name that resolves there)."),
]
# How hard a job may hit each site, across all workers (see docs/configuration.md, Politeness).
politeness_options = [
    click.option("--max-rate", type=click.FloatRange(0, min_open=True), metavar="N",
                 help="Most requests per second to one domain, across all workers."),
    click.option("--per-domain-concurrency", type=click.IntRange(1), metavar="N",
                 help="Most requests in flight to one domain, across all workers (default 8)."),
    click.option("--max-pages", type=click.IntRange(1), metavar="N",
                 help="Stop adding items once the job holds N."),
    click.option("--max-pages-per-domain", type=click.IntRange(1), metavar="N",
                 help="Stop adding items of a domain once the job holds N of it."),
    click.option("--max-duration", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
                 help="Stop dispatching SECONDS after the job started (tracker's clock): what "
                      "is in flight finishes, then the job ends expired, its queued items left "
                      "queued."),
    click.option("--priority-rule", metavar="breadth-first|depth-first|MODULE:FUNCTION",
                 help="The priority of found links within their domain's queue (higher goes "
                      "first): breadth-first (all 0, first in first out; the default), "
                      "depth-first (a link's depth), or a function(url, depth, parent_url) -> "
                      "int of your own, from a module that DISTSCRAPE_PLUGIN_MODULES allows."),
    click.option("--shards", type=int, metavar="N",
                 help="Spread the job over N hash-tag shards by domain, so it uses several "
                      "masters of a Redis Cluster (default 1)."),
]
# How a job that runs again fetches the pages it knows (see docs/guide.md, Recurring crawls).
revisit_options = [
    click.option("--revisit", is_flag=True,
                 help="Keep a record of every saved page; each later run (generation) fetches "
                      "again only the pages that are due, asking their servers whether they "
                      "changed, and saves only those that did."),
    click.option("--revisit-interval", metavar="DURATION",
                 help="With --revisit: how long after a run a page is due again (e.g. 6h, 7d; "
                      "default 0: in every run)."),
]
# When a job seeded to workers runs again (distscrape seed; see docs/guide.md).
schedule_options = [
    click.option("--every", metavar="DURATION",
                 help="Run the job again every DURATION (e.g. 6h, 1d), each run a new "
                      "generation; any live worker starts it."),
    click.option("--cron", metavar="EXPR",
                 help="Run the job again at the times of a cron expression (five fields, UTC), "
                      "e.g. '0 3 * * *'."),
]
# Which sitemaps a job reads (see docs/configuration.md, Sitemaps).
sitemap_options = [
    click.option("--sitemaps", "sitemaps_mode", type=click.Choice(["ignore", "follow", "only"]),
                 help="Sitemaps robots.txt lists: ignore them (the default), follow the pages "
                      "they list besides the links found in pages, or crawl only the seeds and "
                      "the pages they list."),
    click.option("--guess-sitemaps", is_flag=True,
                 help="Also read /sitemap.xml of every host crawled (with --sitemaps follow or "
                      "only)."),
    click.option("--max-sitemap-urls", type=click.IntRange(1), metavar="N",
                 help="Take at most N entries from the sitemaps of one host (default 100000)."),
    click.option("--max-sitemap-depth", type=click.IntRange(0, 5), metavar="N",
                 help="Follow sitemap indexes N levels down (default 2; 0: no index)."),
]
# The flags that set a field of the job's spec, by parameter: (option, field). They override
# --config field by field.
SPEC_FLAGS = {
    "link_regex": ("--link-regex", "scraper.link_regex"),
    "all_hosts": ("--all-hosts", "scraper.same_host"),
    "scraper": ("--scraper", "scraper.kind"),
    "id_regex": ("--id-regex", "scraper.id_regex"),
    "download_url_fmt": ("--download-url-fmt", "scraper.download_url_fmt"),
    "saver": ("--saver", "saver.kind"),
    "output": ("--output", "saver.output"),
    "ignore_robots": ("--ignore-robots", "fetch.obey_robots"),
    "user_agent": ("--user-agent", "fetch.user_agent"),
    "max_depth": ("--max-depth", "scraper.max_depth"),
    "allow_domains": ("--allow-domain", "scraper.allowed_domains"),
    "allow_private": ("--allow-private", "fetch.allow_private"),
    "max_rate": ("--max-rate", "politeness.max_rate"),
    "per_domain_concurrency": ("--per-domain-concurrency", "politeness.per_domain_concurrency"),
    "max_pages": ("--max-pages", "politeness.max_pages"),
    "max_pages_per_domain": ("--max-pages-per-domain", "politeness.max_pages_per_domain"),
    "max_duration": ("--max-duration", "politeness.max_duration"),
    "priority_rule": ("--priority-rule", "priority.rule"),
    "shards": ("--shards", "tracker.shards"),
    "revisit": ("--revisit", "revisit"),
    "revisit_interval": ("--revisit-interval", "revisit.interval"),
    "sitemaps_mode": ("--sitemaps", "sitemaps.mode"),
    "guess_sitemaps": ("--guess-sitemaps", "sitemaps.guess"),
    "max_sitemap_urls": ("--max-sitemap-urls", "sitemaps.max_urls_per_host"),
    "max_sitemap_depth": ("--max-sitemap-depth", "sitemaps.max_depth"),
}
# Flags of seed only (a schedule needs workers that stay up).
SCHEDULE_FLAGS = {
    "every": ("--every", "schedule.every"),
    "cron": ("--cron", "schedule.cron"),
}
# On/off flags: the value a given flag sets its field to (not given, the field is left alone).
FLAG_VALUES = {"all_hosts": False, "ignore_robots": False, "allow_private": True,
               "guess_sitemaps": True}
# Flags that turn a whole section on with its defaults.
SECTION_FLAGS = {"revisit"}


def with_spec_options(wrapped=None, *, schedules: bool = False):
    """Give a command the spec's options (with ``schedules``, --every and --cron too); they
    reach it as one ``spec_flags`` dict."""
    if wrapped is None:
        return functools.partial(with_spec_options, schedules=schedules)
    params = (*SPEC_FLAGS, *(SCHEDULE_FLAGS if schedules else ()), "config")

    @functools.wraps(wrapped)
    def command(*args: Any, **kwargs: Any) -> Any:
        flags = {param: kwargs.pop(param) for param in params}
        return wrapped(*args, spec_flags=flags, **kwargs)

    for option in reversed(
        spec_options + scraper_saver_options + policy_options + politeness_options
        + sitemap_options + revisit_options + (schedule_options if schedules else [])
    ):
        command = option(command)
    return command


def spec_data(
    seeds: tuple[str, ...], flags: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The job's spec as data (--config, overridden by the flags and SEEDs), and what each field
    is called in errors: the flag that set it, or the field and the file it came from."""
    config = flags["config"]
    data: dict[str, Any] = load_config_file(config) if config else {}
    names = {field: f"{field} in {config}" for field in _fields(data)}
    overrides: dict[str, Any] = {"seeds": list(seeds) or None}
    for param, (option, field) in {**SPEC_FLAGS, **SCHEDULE_FLAGS}.items():
        if param not in flags:
            continue
        value = flags[param]
        if param in SECTION_FLAGS:
            if value:
                overrides.setdefault(field, {})
                names[field] = option
            continue
        if param in FLAG_VALUES:
            value = FLAG_VALUES[param] if value else None
        elif isinstance(value, tuple):  # a repeatable option
            value = list(value) or None
        if value is not None:
            section, _, key = field.partition(".")
            overrides.setdefault(section, {})[key] = value
            names[field] = option
        elif field not in names:  # given nowhere: named as it may be given
            names[field] = f"{field} (or {option})" if config else option
    # Seeds are checked as a whole (they depend on the scraper), so their errors have no field.
    names["(root)"] = "SEED" if seeds else f"seeds in {config}"
    return merge(data, overrides), names


def _fields(data: Any, prefix: str = "") -> list[str]:
    """Every dotted field of a (nested) dict, sections included."""
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = f"{prefix}{key}"
        out += [field, *_fields(value, field + ".")]
    return out


def spec_from_data(data: dict[str, Any], names: dict[str, str]) -> JobSpec:
    """The checked spec of ``data`` (from :func:`spec_data`), its output made absolute; errors
    name fields as ``names`` does."""
    from ..core.seeding import spec_from_data as checked_spec

    if not data.get("seeds"):
        raise click.UsageError(
            "give at least one SEED URL (or seeds = [...] in --config, or an --ids-file)"
        )
    return checked_spec(data, names)


def check_spec_components(spec: JobSpec, settings: Settings, names: dict[str, str]) -> None:
    """Refuse, before anything is stored or fetched, a spec whose classes or output ``settings``
    (this process's) do not allow, as a worker with the same settings would."""
    from ..core.components import check_components

    check_components(spec, settings, names)
