"""Exceptions raised by distscrape-celery, and the wording of a validation error for a person.

Every exception the package raises on purpose derives from :class:`DistscrapeError`, so callers (and
the CLI) can tell our errors, which carry a message meant for a person, from bugs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from pydantic import ValidationError


class DistscrapeError(Exception):
    """Root of every error raised on purpose by distscrape-celery."""


class ConfigError(DistscrapeError, ValueError):
    """A setting, job spec or command-line value is invalid; the message names the field."""


class SpecError(ConfigError):
    """A job spec is invalid; ``problems`` holds (field, message) for each problem, the field
    named as the user wrote it (an option, or the field and its file)."""

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class PluginNotAllowed(ConfigError):
    """A job spec names a class whose module this process's settings do not allow it to import
    (``DISTSCRAPE_PLUGIN_MODULES``); the module was not imported."""


class OutputNotAllowed(ConfigError):
    """A job spec's file output lies outside the directories this process's settings allow
    (``DISTSCRAPE_OUTPUT_ROOTS``); nothing was written."""


class JobNotFound(DistscrapeError, LookupError):
    """No job of that name has been seeded on this tracker."""


class JobConflict(DistscrapeError):
    """A job of that name already exists with a different spec."""


class JobStateError(DistscrapeError):
    """A job cannot do that in its state (pause a finished job, delete a running one)."""


class TrackerUnavailable(DistscrapeError):
    """The tracker's store (Redis) cannot be reached or answered with an error."""


class FetchError(DistscrapeError):
    """A download failed. ``retryable`` says whether trying again later may succeed;
    ``retry_after`` is how many seconds the server asked us to wait first (``Retry-After``), or
    None; ``status`` the HTTP status that failed it, if one did."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


class SaveError(DistscrapeError):
    """A saver could not store an item."""


class EmbeddedServiceError(DistscrapeError):
    """An embedded service (Redis or a worker process) could not be started."""


def format_validation_error(
    error: ValidationError, prefix: str = "", names: Optional[Mapping[str, str]] = None
) -> str:
    """The message of the :class:`ConfigError` that a pydantic ``error`` becomes: one part per
    problem, each naming the field, for people rather than programs. ``prefix`` names a field as
    its environment variable (``DISTSCRAPE_`` + its name in capitals); ``names`` maps a field to
    what the user wrote for it instead (an option such as ``--redis-url``)."""
    return "; ".join(f"{field}: {message}" if field else message
                     for field, message in validation_problems(error, prefix, names))


def validation_problems(
    error: ValidationError, prefix: str = "", names: Optional[Mapping[str, str]] = None
) -> list[tuple[str, str]]:
    """Each problem of a pydantic ``error`` as (field, message), the field named as in
    :func:`format_validation_error` ("" for a rule across settings, whose message names them)."""
    problems = []
    for problem in error.errors():
        field = ".".join(str(p) for p in problem["loc"]) or "(root)"
        message = problem["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        if names and field in names:
            field = names[field]
        elif field == "(root)" and prefix:
            field = ""
        elif prefix:
            field = prefix + field.upper()
        problems.append((field, message))
    return problems
