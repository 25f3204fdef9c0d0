"""The tracker's defaults, each written once: the trackers' constructors, the job's domain
limits and the process settings (``settings.py``, ``DISTSCRAPE_*``) all take them from here.

This module imports nothing from the package, so any module may import it.
"""

# Seconds a worker may hold an item without a heartbeat before it goes to another worker
# (DISTSCRAPE_LEASE_SECONDS).
LEASE_SECONDS = 60.0
# Scrape messages of a job the broker may hold, per unit of the live workers' concurrency
# (DISTSCRAPE_DISPATCH_FACTOR).
DISPATCH_FACTOR = 0.5
# Pages of save messages of a job the broker may hold, per unit of the live workers'
# concurrency (DISTSCRAPE_SAVE_BACKLOG_FACTOR).
SAVE_BACKLOG_FACTOR = 2
# Seconds a read from the tracker's Redis may hang before its connection is made again
# (DISTSCRAPE_REDIS_SOCKET_TIMEOUT, which the Redis broker's connections take too).
REDIS_SOCKET_TIMEOUT = 30.0
# Most items of one domain in flight (dispatched or leased) at once, when the job names no
# other (DomainLimits).
DOMAIN_CONCURRENCY = 8
