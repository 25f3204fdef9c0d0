"""Without a reachable PostgreSQL server the tests that need one skip and say why, except in CI
(CI=true), where that is a failure: CI's machine has a server, so a skip there would hide a gap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT

NEEDS_A_DATABASE = '''
def test_needs_a_database(postgres_dsn):
    pass
'''


@pytest.mark.parametrize("ci,outcome", [("", "1 skipped"), ("true", "1 error")])
def test_a_missing_server_skips_except_in_ci(tmp_path, ci, outcome):
    test_file = tmp_path / "test_needs_a_database.py"
    test_file.write_text(NEEDS_A_DATABASE)
    env = {**os.environ, "CI": ci, "DISTSCRAPE_TEST_POSTGRES": "postgresql://postgres@127.0.0.1:1/x"}
    res = subprocess.run(
        # The repository's fixtures, loaded as a plug-in: the test file is outside tests/.
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-p", "tests.conftest", "-o", "addopts=-ra", "-c", str(REPO_ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), str(test_file)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert outcome in res.stdout, res.stdout[-3000:]
    assert "no PostgreSQL server for the tests" in res.stdout
    assert 'port 1 failed' in res.stdout
