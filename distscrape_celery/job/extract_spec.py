"""The extract section of a job spec: which records a saved page yields. Fields are CSS or XPath
selectors (parsel's, as Scrapy runs them), each with an optional regex step; ``item`` turns one
record per page into one per repeating block; JSON-LD and microdata, and a function of your own,
when asked. Every selector and regex is compiled here, so a bad one is refused when the job is
seeded, under its field's name."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from parsel import Selector
from pydantic import Field, field_validator, model_validator

from .patterns import compile_pattern
from .sections import StrictModel

# Every record carries these keys, about the page it came from; no field may take their names.
PAGE_KEYS = ("url", "status", "fetched_at", "job")
STRUCTURED_KINDS = ("json-ld", "microdata")
# The field that each kind of structured data fills, in a page's record.
STRUCTURED_FIELDS = {"json-ld": "json_ld", "microdata": "microdata"}
_DOTTED_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# An empty document to compile selectors against: parsel compiles an expression when it runs it.
_PROBE = Selector(text="<html></html>")


def check_selector(css: Optional[str], xpath: Optional[str]) -> None:
    """Raise ValueError unless the CSS selector ``css`` or the XPath ``xpath`` (parsel's
    dialects: ``::text``, ``::attr(name)``; EXSLT ``re:`` functions) parses."""
    try:
        if css is not None:
            _PROBE.css(css)
        if xpath is not None:
            _PROBE.xpath(xpath)
    except Exception as exc:  # cssselect's SelectorError, parsel's ValueError for XPath
        kind, expression = ("CSS selector", css) if css is not None else ("XPath", xpath)
        detail = str(exc).removeprefix("XPath error: ")
        raise ValueError(f"{kind} {expression!r} does not parse: {detail}") from None


class FieldSpec(StrictModel):
    """One field of a record: a CSS selector or an XPath (exactly one), its matches' text
    (``::text``, ``::attr(href)``, ``text()``, ``@href``; an element matched is its HTML), then
    ``re`` if given (its first group's matches, or the whole match). The first value, or
    with ``all`` every value as a list; nothing matched gives None, or [] with ``all``."""

    css: Optional[str] = Field(None, description="A CSS selector, with parsel's ::text and ::attr(name).")
    xpath: Optional[str] = Field(None, description="An XPath 1.0 expression (EXSLT re: functions too).")
    re: Optional[str] = Field(
        None, description="A regex applied to each value (its first group, if it has one)."
    )
    all: bool = Field(False, description="A list of every value instead of the first.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """A bare string is a CSS selector."""
        return {"css": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_selector(self) -> "FieldSpec":
        if (self.css is None) == (self.xpath is None):
            raise ValueError("give exactly one of css and xpath")
        check_selector(self.css, self.xpath)
        return self

    @field_validator("re")
    @classmethod
    def _regex(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            compile_pattern(value)
        return value


class ExtractSpec(StrictModel):
    """Which records each saved page yields (one per page, or one per ``item`` block), and how
    many at most. A field that matches nothing is empty, never an error."""

    fields: dict[str, FieldSpec] = Field(
        default_factory=dict, max_length=200,
        description='The record\'s fields by name: a CSS selector as a string ("h1::text"), or '
        '{css = ..., xpath = ..., re = ..., all = true}.',
    )
    item: Optional[str] = Field(
        None, description="A CSS selector of the repeating block (a product in a list): one "
        "record for each block it matches, its fields' selectors relative to the block (XPaths "
        "starting with ./). None: one record per page.",
    )
    item_xpath: Optional[str] = Field(None, description="The same as an XPath.")
    structured: list[Literal["json-ld", "microdata"]] = Field(
        [], description='"json-ld" and/or "microdata": the page\'s structured data, as the '
        "record's fields json_ld and microdata (lists of objects).",
    )
    function: Optional[str] = Field(
        None, description='A function of your own as "package.module:function", called with '
        "each saved page (distscrape_celery.extract.Page) and returning its records (dicts); "
        "they follow the selectors' records.",
    )
    max_records: int = Field(
        1000, ge=1, le=100_000, description="Records kept from one page; the rest are dropped."
    )
    max_record_bytes: int = Field(
        64 * 1024, ge=256, le=16 * 1024 * 1024,
        description="Largest record (as JSON); a larger one is dropped.",
    )

    @field_validator("fields")
    @classmethod
    def _names(cls, value: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        for name in value:
            if not name or not name.isprintable():
                raise ValueError(f"field name {name!r} is empty or not printable")
            if name in PAGE_KEYS or name in STRUCTURED_FIELDS.values():
                raise ValueError(
                    f"field name {name!r} is taken: every record has {', '.join(PAGE_KEYS)}, "
                    f"and structured data fills {', '.join(STRUCTURED_FIELDS.values())}"
                )
        return value

    @field_validator("item")
    @classmethod
    def _item_css(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            check_selector(value, None)
        return value

    @field_validator("item_xpath")
    @classmethod
    def _item_xpath(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            check_selector(None, value)
        return value

    @field_validator("function")
    @classmethod
    def _function(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _DOTTED_FUNCTION.match(value):
            raise ValueError(f"{value!r} is not a function as 'package.module:function'")
        return value

    @model_validator(mode="after")
    def _something_to_extract(self) -> "ExtractSpec":
        if self.item is not None and self.item_xpath is not None:
            raise ValueError("give at most one of item and item_xpath")
        blocks = self.item is not None or self.item_xpath is not None
        if blocks and not self.fields:
            raise ValueError("item names the repeating block, and fields what each record holds: "
                             "give fields too")
        if blocks and self.structured:
            raise ValueError("structured data is the page's: it goes in the record of a page, "
                             "without item or item_xpath (use a function for more)")
        if not (self.fields or self.structured or self.function):
            raise ValueError("nothing to extract: give fields, structured or function")
        return self

    @property
    def per_block(self) -> bool:
        """Whether a page yields a record per block (``item``) rather than one."""
        return self.item is not None or self.item_xpath is not None
