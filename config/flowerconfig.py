# Flower configuration for distscrape:  celery -A distscrape_celery flower --conf=config/flowerconfig.py
# Credentials never go here or on the command line: set FLOWER_BASIC_AUTH=user:password in
# Flower's environment (Flower reads every option from FLOWER_<OPTION>).
#
# Flower runs this file as Python when it starts; names that are Flower options set them.

# Listen on loopback only (Flower's own default is every address, while it logs
# "Visit me at http://127.0.0.1:5555"): reach it through an SSH tunnel or a reverse proxy, or
# give --address=0.0.0.0 on the command line (which wins over this file), as compose.yaml does
# inside its own network.
address = "127.0.0.1"

# Every task's arguments in the task list: a scrape task's are [job, URL or ID], a batch of saves'
# [job, [[item, fencing token, download metadata], ...]] (a single save task's the same, unnested),
# so the list shows which job and pages each is for.
tasks_columns = "name,uuid,state,args,received,started,runtime,worker"

# Flower keeps this many tasks in memory (oldest dropped first); a crawl makes a scrape task per
# page and a save task per batch of pages.
max_tasks = 20000

# Workers that stopped heartbeating leave the list (and Flower's /metrics) after this many seconds.
purge_offline_workers = 600

# Flower asks workers to send task events while it runs, also to workers started without -E.
enable_events = True

# Flower 2.2 serves /metrics to anyone, even with basic auth on; require the same credentials
# there as for the UI and the API (Prometheus then scrapes it with basic_auth).
from flower.views import monitor as _monitor  # noqa: E402
from tornado.web import authenticated as _authenticated  # noqa: E402

if not getattr(_monitor.Metrics.get, "_distscrape_auth", False):
    _monitor.Metrics.get = _authenticated(_monitor.Metrics.get)
    _monitor.Metrics.get._distscrape_auth = True
