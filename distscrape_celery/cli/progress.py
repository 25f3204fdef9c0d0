"""Progress bars on stderr, for ``seed --ids-file`` and ``crawl``: shown on a terminal only."""

from __future__ import annotations

from typing import Any, Optional

import click

from ..job.seeds import SeedFile


class StderrBar:
    """A rich progress bar on stderr, shown on a terminal only, stopped on exit."""

    bar: Any = None

    def _start(self, *columns: Any) -> bool:
        """Show a bar of ``columns``; False (no bar) when stderr is not a terminal."""
        from rich.console import Console
        from rich.progress import Progress

        console = Console(stderr=True)
        if not console.is_terminal:
            return False
        self.bar = Progress(*columns, console=console)
        self.bar.start()
        return True

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def say(self, message: str) -> None:
        """A line on stderr, above the bar while it is shown (which would paint over it)."""
        if self.bar is not None:
            self.bar.console.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            click.echo(message, err=True)


class SeedProgress(StderrBar):
    """A progress bar of a seed file's import (bytes read, seeds new and seen)."""

    def __init__(self) -> None:
        self.reader: Optional[SeedFile] = None
        self.size: Optional[int] = None

    def track(self, reader: SeedFile, size: Optional[int]) -> None:
        self.reader, self.size = reader, size

    def __enter__(self) -> "SeedProgress":
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

        if self.reader is not None and self._start(
            TextColumn("[bold]seeding"), BarColumn(), TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
        ):
            self.task = self.bar.add_task("seed", total=self.size, detail="")
        return self

    def update(self, taken: int, new: int) -> None:
        if self.bar is not None and self.reader is not None:
            self.bar.update(
                self.task, completed=self.reader.bytes_read,
                detail=f"{taken:,} read: {new:,} new, {taken - new:,} already seen",
            )


class CrawlProgress(StderrBar):
    """A live progress bar of a crawl on a terminal; nothing when quiet or not a terminal.

    Entered, it gives the function to call with the crawl's stats, or None without a bar."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        if self.quiet or not self._start(
            TextColumn("[bold]crawling"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
        ):
            return None
        task = self.bar.add_task("crawl", total=None, detail="")

        def update(stats) -> None:
            self.bar.update(
                task, total=max(stats.seen, 1), completed=stats.done + stats.dead,
                detail=f"{stats.leased} active, {stats.queued} queued, {stats.dead} dead",
            )

        return update
