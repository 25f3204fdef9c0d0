"""Test-only scraper and saver plugins, loaded by worker processes by dotted path
(``tests.plugins.savers:CrashingSaver``); the tests put the repository root on the workers'
PYTHONPATH."""
