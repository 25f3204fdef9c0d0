"""What joining a crawl's archive shards into the named file costs (`distscrape crawl` does it at
its end).

    .venv/bin/python -m bench.bench_join [--pages 3000] [--workers 4]

Saves ``--pages`` pages of a generated site into ``--workers`` shards of each archive kind (as
that many worker processes would), then joins them; prints the CPU seconds of both (CPU, not
wall time, so that a busy machine does not distort it) and the sizes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from distscrape_celery.testing.sitegen import generate_site

from distscrape_celery.web.fetch import Download
from distscrape_celery.savers import TarItemSaver, WarcItemSaver
from distscrape_celery.savers.tar import join_tar
from distscrape_celery.savers.warc import join_warc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    site = generate_site(n_pages=args.pages, seed=5, unreachable=0)
    pages = [(f"http://127.0.0.1:8000{p}", site.pages[p]) for p in sorted(site.reachable)]
    print(f"{len(pages)} pages, {sum(len(b) for _, b in pages) / 1e6:.1f} MB of bodies")
    for ext in (".tar", ".tar.gz", ".tar.bz2", ".warc.gz"):
        with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
            output = Path(tmp) / f"site{ext}"
            cls = WarcItemSaver if ext == ".warc.gz" else TarItemSaver
            savers = [cls(output, worker_id=f"w{i}", fsync=False) for i in range(args.workers)]
            started = time.process_time()
            for n, (item, body) in enumerate(pages):
                savers[n % len(savers)].save(item, Download(
                    url=item, status=200, content_type="text/html", body=body, fetched_at=1.0))
            for saver in savers:
                saver.close()
            saving = time.process_time() - started
            shards_size = sum(p.stat().st_size for p in Path(tmp).iterdir())
            started = time.process_time()
            join = join_warc if ext == ".warc.gz" else join_tar
            joined = join(output, max_unit=11 << 20)
            joining = time.process_time() - started
            print(f"{ext:9} saving {saving:.2f}s CPU, joining {joining:.2f}s CPU "
                  f"({joined.items} items from {len(joined.shards)} shards, "
                  f"{shards_size / 1e6:.1f} MB -> {output.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
