"""Scrapers: download an item and find more items in what came back.

``SimpleScraper`` follows links (items are URLs); ``IDScraper`` discovers IDs (items are IDs, or
listing URLs). A job's spec picks one by ``scraper.kind``, or names a custom class by dotted path.
"""

from .base import FoundItems, Scraper
from .ids import IDScraper
from .simple import SimpleScraper

__all__ = ["FoundItems", "IDScraper", "Scraper", "SimpleScraper"]
