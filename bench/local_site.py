"""Serve a generated site on 127.0.0.1, and optionally run a command against it.

    python bench/local_site.py --pages 300                    # serve until Ctrl+C
    python bench/local_site.py --pages 300 -- distscrape crawl {url} --output crawl-output

With a command, ``{url}`` in it is replaced by the site's root URL; the site is served while the
command runs and this script exits with the command's exit status. Used by the README's first
command and by the benchmarks, so that trying the crawler sends no traffic off this machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sitegen import SiteServer, generate_site  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300, help="pages reachable from /")
    parser.add_argument("--page-bytes", type=int, default=0, help="filler bytes per page")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS ({url})")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    site = generate_site(n_pages=args.pages, page_padding=args.page_bytes)
    with SiteServer(site, delay=args.delay) as server:
        print(f"serving {len(site.pages)} pages ({len(site.reachable)} reachable from /) "
              f"at {server.url('/')}", file=sys.stderr, flush=True)
        if not command:
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
        return subprocess.call([part.replace("{url}", server.url("/")) for part in command])


if __name__ == "__main__":
    sys.exit(main())
