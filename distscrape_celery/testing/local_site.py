"""Serve a generated site on 127.0.0.1, and optionally run a command against it.

    python -m distscrape_celery.testing.local_site --pages 300       # serve until Ctrl+C
    python -m distscrape_celery.testing.local_site --pages 300 -- distscrape crawl {url} --output crawl-output

With a command, ``{url}`` in it is replaced by the site's root URL; the site is served while the
command runs and this script exits with the command's exit status. Used by the README's first
command and by the benchmarks, so that trying the crawler sends no traffic off this machine.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from distscrape_celery.testing.sitegen import SiteServer, generate_site


# The site's port when none is given: a fixed one, so that the README's command, run again after
# a Ctrl-C, crawls the same URLs and resumes the crawl.
DEFAULT_PORT = 8301


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300, help="pages reachable from /")
    parser.add_argument("--page-bytes", type=int, default=0, help="filler bytes per page")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}, so that the same "
                        "command serves the same URLs and a crawl of them can be resumed; "
                        "0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (default 127.0.0.1; another only inside a "
                        "network of your own, such as a container's)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS ({url})")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    site = generate_site(n_pages=args.pages, page_padding=args.page_bytes)
    try:
        server = SiteServer(site, delay=args.delay, host=args.host, port=args.port)
    except OSError as exc:
        print(f"local_site: cannot serve on {args.host}:{args.port} ({exc.strerror}): give "
              "another --port, or --port 0 for any free one", file=sys.stderr)
        return 2
    with server:
        print(f"serving {len(site.pages)} pages ({len(site.reachable)} reachable from /) "
              f"at {server.url('/')}", file=sys.stderr, flush=True)
        if not command:
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
        return run_command([part.replace("{url}", server.url("/")) for part in command])


def run_command(command: list[str]) -> int:
    """Run ``command`` as a shell would, and return its exit status (128+N if signal N killed it).

    Ctrl-C on the terminal and a hang-up reach the command directly (it is in our process
    group), so here they are ignored rather than acted on twice; SIGTERM sent to us alone (kill,
    timeout) is passed on. In no case is the command killed: it stops what it started itself.
    """
    proc = subprocess.Popen(command)
    # Only now, or the command would inherit SIGINT and SIGHUP as ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    status = proc.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
