"""The chaos benchmark's saver: FileItemSaver that also logs every save call, to count duplicates.

Each call appends one line (the item) to the file named by CHAOS_SAVES_LOG with O_APPEND, so
lines from many processes never interleave. Benchmark-only: the package reads no environment.
"""

from __future__ import annotations

import os

from distscrape_celery.savers import FileItemSaver


class CountingSaver(FileItemSaver):
    def save(self, item, download):
        where = super().save(item, download)
        fd = os.open(os.environ["CHAOS_SAVES_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (item + "\n").encode())
        finally:
            os.close(fd)
        return where
