"""What the program prints and logs, made fit to be shown: secrets kept out (every configured URL,
Redis, broker or output, is shown through :func:`redact`), and no control character a site sent
reaches a terminal or a log as is (:func:`escape`, and :func:`escape_log_records` for every log
message of a process)."""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Any

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


# -- control characters ------------------------------------------------------------------------

# Unicode categories escaped by escape(): controls (C0, DEL, C1), format characters (bidi overrides
# and isolates such as U+202E, zero-width characters, the BOM), surrogates, private use,
# unassigned code points, and the line and paragraph separators. Space separators (Zs) stay:
# they move no cursor and reorder nothing.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def escape(text: str) -> str:
    r"""``text`` with every character that could act on a terminal or disguise what is shown
    (see _ESCAPED_CATEGORIES: ESC, BEL, CR, LF, TAB, C1 controls, U+202E...) written as a visible
    escape: ``\x1b`` for ESC, ``\x0a`` for a line feed, ``\u202e``, ``\U000e0001``. Every other
    character, letters of any script included, stays as it is. A backslash is not escaped, so
    escaping text twice changes nothing (it is escaped where it is stored and again where it is
    shown); a shown ``\x1b`` may thus also be those four characters sent as such."""
    if text.isprintable():  # the usual case, checked in C: no control or format character
        return text
    return "".join(_escaped(char) for char in text)


def _escaped(char: str) -> str:
    if unicodedata.category(char) not in _ESCAPED_CATEGORIES:
        return char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_lines(text: str) -> str:
    """:func:`escape` of each line of ``text``, the line breaks (LF) kept: for a traceback."""
    return "\n".join(escape(line) for line in text.split("\n"))


def escape_log_records() -> None:
    """From now on, every log record this process makes, whichever logger and handler it goes
    to (ours, Celery's, urllib3's), has its message and traceback escaped (:func:`escape`): a URL,
    header or reason a site sent, interpolated into a message, never writes a control character
    to a log file or terminal. Idempotent.

    A record factory rather than a handler filter or formatter: Celery configures the worker's
    handlers and formatters itself (and an operator or plug-in may add more), while every record,
    whoever configured what, is made by the one factory. A record is only made once its logger's
    level lets it through, so formatting its message here costs no more than its handler would."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "escapes_controls", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _escape_record(previous(*args, **kwargs))

    factory.escapes_controls = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _escape_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message formatted and escaped, and its traceback (if any) formatted
    and escaped line by line, so that a formatter shows them as they are now."""
    try:
        message = record.getMessage()
    except Exception:
        return record  # a broken format string: the handler reports it, as without this
    record.msg, record.args = escape(message), None
    if record.exc_info and not record.exc_text:
        # Formatters show exc_text when it is set, and format exc_info into it only when not.
        record.exc_text = escape_lines(logging.Formatter().formatException(record.exc_info))
    return record
