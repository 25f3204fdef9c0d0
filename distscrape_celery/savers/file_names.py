"""How the file saver names an item's file: a name scheme over fields taken from the item, each
part escaped so that every name stays inside the output and distinct items get distinct names."""

from __future__ import annotations

import hashlib
import re
import string
from typing import Optional
from urllib.parse import urlsplit

from ..errors import ConfigError

NAME_FIELDS = ("host", "port", "path", "query", "qhash", "sha1", "shard", "job")
DEFAULT_NAME_SCHEME = "{host}/{path}"

_ALLOWED_FIELDS = " ".join("{" + name + "}" for name in NAME_FIELDS)
# A "%XX" escape, or one character that may not appear as is in a file name.
_ESCAPE_OR_UNSAFE = re.compile(r"%([0-9A-Fa-f]{2})|[^A-Za-z0-9._~!$&'()+,;=@-]")
# Bytes a URL cannot carry raw (controls, space, non-ASCII, "<>\"\\^`{|}"): "%XX" and the raw
# character fetch the same resource, so both get the same name. Any other escape ("%2F", "%3F",
# "%26", "%2E", ...) means something else than its raw character, so its "%" is escaped in turn.
_RAW_ILLEGAL = frozenset(range(0x21)) | frozenset(range(0x7F, 0x100)) | frozenset(b'"<>\\^`{|}')
# urlsplit silently drops these; an item holding them is named as a non-URL, whole, so that it
# cannot share a name with the URL it would be mangled into.
_MANGLED_BY_URLSPLIT = re.compile(r"[\t\r\n]|^[\x00-\x20]")
# The tokens below never come out of escape_name for a path segment ("." and "~" stay raw, raw "/"
# never occurs inside one), so names built with them cannot equal any other item's name.
_EMPTY_SEGMENT = "%2F"
_DOT = "%2E"
_CUT_MARK = "%7E"
_MAX_SEGMENT_BYTES = 200  # names are ASCII once escaped, so characters are bytes
_CUT_KEEP = 150


def parse_scheme(scheme: str) -> list[tuple[str, Optional[str]]]:
    """Split ``scheme`` into (escaped literal text, field name or None) pairs, or raise
    :class:`ConfigError` naming what is wrong."""

    def invalid(reason: str) -> ConfigError:
        return ConfigError(
            f"invalid saver name_scheme {scheme!r}: {reason}; allowed fields: {_ALLOWED_FIELDS}"
        )

    try:
        parsed = list(string.Formatter().parse(scheme))
    except ValueError as exc:
        raise invalid(f"malformed format string ({exc})") from None
    parts: list[tuple[str, Optional[str]]] = []
    for literal, field, format_spec, conversion in parsed:
        if field is not None:
            if field == "" or field.isdigit():
                raise invalid(f"positional field {{{field}}} is not allowed")
            if field not in NAME_FIELDS:
                raise invalid(f"unknown field {{{field}}}")
            if format_spec or conversion:
                raise invalid(f"field {{{field}}} takes no conversion or format spec")
        parts.append(("/".join(escape_name(piece) for piece in literal.split("/")), field))
    if not {"path", "sha1"} & {field for _, field in parts}:
        raise invalid("it must use {path} or {sha1}, or different items would share one file")
    return parts


def field_values(item: str, *, query_in_path: bool) -> dict[str, str]:
    """The escaped value of every name field for ``item``; {path} is "/"-separated segments."""
    host, port, path, query = _split_item(item)
    sha1 = sha1_hex(item)
    if host == "_":
        # Not a URL (an ID, say): the whole item is one name, "/" and all escaped.
        segments = [path]
    else:
        segments = path.split("/")
        if not segments[-1]:
            segments[-1] = "index.html"
        elif "." not in segments[-1]:
            # "/a" becomes a/index.html so that it can coexist with "/a/b".
            segments.append("index.html")
    if query and query_in_path:
        segments[-1] += "?" + query
    return {
        # The port is part of the host's name so that two servers on one host never share files;
        # ":" is escaped, and no host name contains it.
        "host": escape_name(f"{host}:{port}" if port else host),
        "port": port,
        "path": "/".join(escape_name(segment) if segment else _EMPTY_SEGMENT for segment in segments),
        "query": escape_name(query),
        "qhash": sha1_hex(query)[:16] if query else "",
        "sha1": sha1,
        "shard": f"{sha1[:2]}/{sha1[2:4]}",
    }


def _split_item(item: str) -> tuple[str, str, str, str]:
    """(host, port, path relative to the root, query) of ``item``; ("_", "", item, "") for an
    item that is not an absolute URL."""
    if not _MANGLED_BY_URLSPLIT.search(item):
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:  # a bad port or IPv6 literal: not a URL we can take apart
            pass
        else:
            if parts.scheme and parts.hostname:
                port_text = "" if port is None else str(port)
                return parts.hostname.lower(), port_text, parts.path[1:], parts.query
    return "_", "", item, ""


def escape_name(text: str) -> str:
    """``text`` as part of one name segment: only [A-Za-z0-9._~!$&'()+,;=@-] and "%XX" escapes,
    so no "/" or control character; distinct texts stay distinct except as _RAW_ILLEGAL allows."""

    def replace(match: re.Match[str]) -> str:
        hex_digits = match.group(1)
        if hex_digits is None:
            raw = match.group().encode("utf-8", "surrogatepass")
            return "".join(f"%{byte:02X}" for byte in raw)
        if int(hex_digits, 16) in _RAW_ILLEGAL:
            return "%" + hex_digits.upper()
        return "%25" + hex_digits

    return _ESCAPE_OR_UNSAFE.sub(replace, text)


def finish_segment(segment: str) -> str:
    """Make one escaped segment safe to join: never "." or "..", never starting with ".", at
    most 200 bytes."""
    if segment in (".", ".."):
        return _DOT * len(segment)
    if segment.startswith("."):
        # Dot names are what programs of the output's owner read on their own (.bashrc,
        # .ssh/authorized_keys, .local/lib/.../site-packages): no item may choose one.
        segment = _DOT + segment[1:]
    if len(segment) > _MAX_SEGMENT_BYTES:
        return segment[:_CUT_KEEP] + _CUT_MARK + sha1_hex(segment)[:16]
    return segment


def sha1_hex(text: str) -> str:
    """The hex SHA-1 of ``text`` (UTF-8, lone surrogates kept)."""
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
