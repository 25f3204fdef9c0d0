"""Savers: store what was downloaded.

``FileItemSaver`` writes one file per item; ``RedisItemSaver`` one Redis hash per item;
``TarItemSaver`` and ``WarcItemSaver`` append to per-worker archive shards, and
``JsonLinesItemSaver`` a job's records to per-worker JSON Lines shards. A job's spec picks one
by ``saver.kind``, or names a custom class by dotted path.
"""

from .base import ItemSaver
from .files import FileItemSaver
from .jsonl import JsonLinesItemSaver
from .redis import RedisItemSaver
from .tar import TarItemSaver, tar_index
from .warc import WarcItemSaver

__all__ = [
    "FileItemSaver", "ItemSaver", "JsonLinesItemSaver", "RedisItemSaver", "TarItemSaver", "WarcItemSaver", "tar_index",
]
