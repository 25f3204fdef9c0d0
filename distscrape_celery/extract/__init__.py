"""Records from saved pages, as a job's ``[extract]`` asks: fields by CSS or XPath selectors
(:mod:`.selectors`), structured data (:mod:`.structured`) and a function of the job's own
(:mod:`.plugin`), joined by :class:`Extractor`; the page they are given is a :class:`Page`."""

from .extractor import Extractor
from .page import Page, iso_utc, page_record

__all__ = ["Extractor", "Page", "iso_utc", "page_record"]
