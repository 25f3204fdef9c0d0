"""Page text as browsers decode it: BOM, then the HTTP header's charset, then ``<meta>``, then
UTF-8 if the bytes are valid UTF-8, else windows-1252 (what browsers read Latin-1 as)."""

from __future__ import annotations

from typing import Optional

from w3lib.encoding import html_to_unicode


def _utf8_or_latin1(body: bytes) -> Optional[str]:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "cp1252"
    return "utf-8"


def decode_html(content_type: str, body: bytes) -> str:
    """``body`` as text; bytes that are invalid in the chosen encoding become U+FFFD."""
    return html_to_unicode(content_type or None, body, auto_detect_fun=_utf8_or_latin1)[1]
