"""Test-only scraper and saver plugins, loaded by worker processes by dotted path
(``plugins.savers:CrashingSaver``); the tests put ``tests/`` on the workers' PYTHONPATH."""
