"""Scrapers that misbehave on request, for tests/faults/ (see plugins/savers.py for the control
directory ``<output>.ctl`` next to the saver's output).

Control file ``die_before_save_publish`` (one item per line): once the pipeline has made that item
save-pending (``scraped``), the process group of the worker that scraped it is SIGKILLed (a power
cut of its host) just before the save message (or the batch of saves with it) would be sent. ``died/<sha1>`` records the pid.
"""

from __future__ import annotations

import os
import signal
import time

from distscrape_celery.scrapers import SimpleScraper

from .savers import _create_durably, _lines, _sha1, control_dir


class _Controlled(SimpleScraper):
    """A SimpleScraper that reads its instructions from the output's control directory."""

    @classmethod
    def from_spec(cls, spec):
        scraper = super().from_spec(spec)
        scraper.ctl = control_dir(spec.saver.output)
        return scraper


class DyingScraper(_Controlled):
    def find_items(self, item, download):
        found = super().find_items(item, download)
        if item in _lines(self.ctl / "die_before_save_publish"):
            if _create_durably(self.ctl / "died" / _sha1(item), str(os.getpid())):
                _die_before_publishing_save_of(item)
        return found


def _die_before_publishing_save_of(item: str) -> None:
    """In this process, make the publisher kill the whole worker instead of sending the save
    message of ``item``, alone or in a batch (the pipeline sends it after ``tracker.scraped``)."""
    from distscrape_celery.worker.publish import publisher

    send, send_batch = publisher.save, publisher.save_batch

    def save(job, it, token, meta, delay=0):
        if it == item:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return send(job, it, token, meta, delay)

    def save_batch(job, saves):
        if any(entry[0] == item for entry in saves):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return send_batch(job, saves)

    publisher.save, publisher.save_batch = save, save_batch


class StubbornScraper(_Controlled):
    """Control file ``stubborn`` (one item per line): the process that scrapes such an item
    ignores SIGTERM from then on and takes a minute over it (a pool process Celery cannot
    cancel). ``stubborn-started/<sha1>`` records the pid once it has begun."""

    def find_items(self, item, download):
        if item in _lines(self.ctl / "stubborn"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _create_durably(self.ctl / "stubborn-started" / _sha1(item), str(os.getpid()))
            time.sleep(60)
        return super().find_items(item, download)
