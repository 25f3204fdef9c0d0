"""A page's structured data, JSON-LD and microdata, read from its parsed tree.

JSON-LD is the ``application/ld+json`` scripts parsed as JSON (json), each object as the page
wrote it; microdata follows the WHATWG algorithm: an item per top-level ``itemscope``, its
properties from the ``itemprop`` elements within it (and those its ``itemref`` names), a nested
``itemscope`` being an item of its own as a property's value, each value read as the element's
kind says (``content``, ``href``/``src`` made absolute, ``datetime``, ``value``, or the text).
Hand-written rather than extruct: extruct installs RDFa, microformats and RDF libraries with
them (rdflib, pyrdfa3, mf2py), half a minute of every fresh install and half a second of a
worker's start, for these two readers of a few dozen lines."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Optional
from urllib.parse import urljoin

from lxml import etree
from parsel import Selector

from ..job.extract_spec import STRUCTURED_FIELDS

# The elements whose microdata value is a URL, by the attribute that holds it.
_URL_ATTRIBUTES = {"a": "href", "area": "href", "link": "href", "audio": "src", "embed": "src",
                   "iframe": "src", "img": "src", "source": "src", "track": "src", "video": "src",
                   "object": "data"}
# Nested items deeper than this are left out: a page of 10,000 nested itemscopes is no item.
MAX_ITEM_DEPTH = 32
# Elements a page's microdata may look at in all; a page's items nested in each other (each
# walked again as its own top-level item) would otherwise cost its size squared.
MAX_VISITS = 200_000


class StructuredData:
    """The fields ``json_ld`` and ``microdata`` of a page's record, for the ``kinds`` asked for;
    each a list of the page's objects (empty when it has none)."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = tuple(kinds)

    def fields(self, selector: Selector, url: str) -> dict:
        """The structured data of the page that ``selector`` holds."""
        readers = {"json-ld": json_ld, "microdata": microdata}
        return {STRUCTURED_FIELDS[kind]: readers[kind](selector, url) for kind in self.kinds}


def json_ld(selector: Selector, url: str) -> list[Any]:
    """Every JSON-LD object of the page, in order (a script holding a list gives its objects);
    a script that is not JSON is left out."""
    found: list[Any] = []
    for text in selector.xpath(
            "//script[translate(normalize-space(@type), 'LDJSON', 'ldjson')"
            " = 'application/ld+json']/text()").getall():
        try:
            value = json.loads(_without_comment_marks(text))
        except ValueError:
            continue
        found.extend(value if isinstance(value, list) else [value])
    return found


def _without_comment_marks(text: str) -> str:
    """A script's text without the HTML comment marks some sites put around it."""
    text = text.strip()
    if text.startswith("<!--"):
        text = text[4:]
    if text.endswith("-->"):
        text = text[:-3]
    return text


def microdata(selector: Selector, url: str) -> list[dict]:
    """Every top-level microdata item of the page: ``{"type": ..., "id": ..., "properties":
    {name: value, or a list of values if it has several}}`` (type and id when given). Raises
    ValueError past :data:`MAX_VISITS` elements looked at (items nested in each other without
    end)."""
    root = selector.root
    if not isinstance(root, etree._Element):
        return []
    by_id = {element.get("id"): element for element in root.iter() if element.get("id")}
    visits = [MAX_VISITS]
    return [_item(element, url, by_id, 0, visits) for element in root.iter()
            if _is_element(element) and element.get("itemscope") is not None
            and element.get("itemprop") is None]


def _is_element(node: Any) -> bool:
    return isinstance(node, etree._Element) and isinstance(node.tag, str)


def _item(element, url: str, by_id: dict, depth: int, visits: list[int]) -> dict:
    item: dict[str, Any] = {}
    if element.get("itemtype"):
        types = element.get("itemtype").split()
        item["type"] = types[0] if len(types) == 1 else types
    if element.get("itemid"):
        item["id"] = urljoin(url, element.get("itemid").strip())
    properties: dict[str, Any] = {}
    for prop in _properties(element, by_id, visits):
        value = (_item(prop, url, by_id, depth + 1, visits)
                 if prop.get("itemscope") is not None and depth < MAX_ITEM_DEPTH
                 else _value(prop, url))
        for name in prop.get("itemprop", "").split():
            if name in properties:
                previous = properties[name]
                properties[name] = (previous if isinstance(previous, list) else [previous]) + [value]
            else:
                properties[name] = value
    item["properties"] = properties
    return item


def _properties(item, by_id: dict, visits: list[int]) -> list:
    """The elements with ``itemprop`` that belong to ``item``: within it (not within a nested
    item) and within the elements its ``itemref`` names; each once, in document order. Each
    element looked at counts against ``visits``."""
    roots = [item] + [by_id[ref] for ref in (item.get("itemref") or "").split() if ref in by_id]
    seen: set = set()
    pending = [child for root in reversed(roots) for child in reversed(_children(root))]
    found = []
    while pending:
        element = pending.pop()
        if element in seen or element is item:
            continue
        visits[0] -= 1
        if visits[0] < 0:
            raise ValueError(f"its microdata took more than {MAX_VISITS} elements to read")
        seen.add(element)
        if element.get("itemprop") is not None:
            found.append(element)
        if element.get("itemscope") is None:
            pending.extend(reversed(_children(element)))
    return found


def _children(element) -> list:
    return [child for child in element if _is_element(child)]


def _value(element, url: str) -> Optional[str]:
    tag = element.tag.lower() if isinstance(element.tag, str) else ""
    if element.get("content") is not None:
        return element.get("content")
    if tag in _URL_ATTRIBUTES:
        value = element.get(_URL_ATTRIBUTES[tag])
        return urljoin(url, value.strip()) if value is not None else ""
    if tag in ("data", "meter"):
        return element.get("value", "")
    if tag == "time" and element.get("datetime") is not None:
        return element.get("datetime")
    return "".join(element.itertext()).strip()
