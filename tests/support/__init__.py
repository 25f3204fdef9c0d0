"""Helpers shared by the tests and the benchmarks: generated sites, HTTP servers on loopback,
crawl and pipeline set-ups, the command line as a subprocess. Fixtures stay in conftest.py."""
