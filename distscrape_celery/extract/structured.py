"""A page's structured data, JSON-LD and microdata, read by extruct.

extruct rather than our own walk of the page: it reads JSON-LD as sites write it (HTML comments
around the script, trailing commas, several objects or an ``@graph``) and microdata by the W3C
algorithm (``itemref``, nested items, each element's value by its kind), which a short
hand-written reader gets wrong. Imported on first use, so that jobs without structured data
never load it."""

from __future__ import annotations

from collections.abc import Iterable

from parsel import Selector

from ..job.extract_spec import STRUCTURED_FIELDS


class StructuredData:
    """The fields ``json_ld`` and ``microdata`` of a page's record, for the ``kinds`` asked for;
    each a list of the page's objects (empty when it has none)."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = tuple(kinds)
        self._extractors: dict = {}

    def _extractor(self, kind: str):
        extractor = self._extractors.get(kind)
        if extractor is None:
            if kind == "json-ld":
                from extruct.jsonld import JsonLdExtractor
                extractor = JsonLdExtractor()
            else:
                from extruct.w3cmicrodata import MicrodataExtractor
                extractor = MicrodataExtractor()
            self._extractors[kind] = extractor
        return extractor

    def fields(self, selector: Selector, url: str) -> dict:
        """The structured data of the page that ``selector`` holds (its lxml tree is shared)."""
        return {STRUCTURED_FIELDS[kind]: list(self._extractor(kind).extract_items(selector.root, url))
                for kind in self.kinds}
