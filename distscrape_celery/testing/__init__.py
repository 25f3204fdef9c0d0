"""Tools for trying and testing the crawler without sending traffic off this machine (as
``celery.contrib.testing``): :mod:`.sitegen` generates deterministic sites and serves them on
loopback, :mod:`.local_site` serves one and runs a command against it
(``python -m distscrape_celery.testing.local_site``). The tests and the benchmarks use them;
nothing else in the package imports them, and they import nothing from it."""
