"""The dashboard in a real headless browser (Debian's chromium, driven through its
chromedriver by selenium): sign in with the token, see a job crawled by real workers update
live, open its domains, press Pause and find the job paused in Redis."""

from __future__ import annotations

import os
import shutil

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import JobState, RedisTracker
from tests.support.api import TOKEN, ApiServer
from tests.support.crawl import crawl_settings

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000"]


@pytest.fixture
def browser(tmp_path):
    # .ci/run installs Debian's chromium and chromium-driver. Without them the test skips,
    # saying why (the README's test command needs only Python), except in CI, where it fails.
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        reason = ("the dashboard test needs Debian's chromium and chromium-driver "
                  "(apt-get install chromium chromium-driver; .ci/run does)")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _text(driver, css: str) -> str:
    """The text of the first element ``css`` selects now ("" if none), read in one step: the
    page updates its tables under the test."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css)


def test_sign_in_watch_a_job_live_and_pause_it(redis_url, workers, browser, tmp_path):
    settings = crawl_settings(redis_url)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, f"dash-{i}") for i in range(2)]
    site_pages = generate_site(n_pages=400, seed=5, unreachable=0)
    # Slow pages, one at a time: the crawl lasts long enough to be watched and paused.
    with SiteServer(site_pages, delay=0.15) as site, \
            ApiServer(redis_url, env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)}) as api:
        wait_for_workers(tracker, 2, procs=procs)
        spec = {"seeds": [site.url("/")], "saver": {"output": str(tmp_path / "out")},
                "politeness": {"per_domain_concurrency": 1}}
        assert api.request("PUT", "/api/jobs/watched", spec)[0] == 201
        wait = WebDriverWait(browser, 60, poll_frequency=0.2)

        browser.get(api.url + "/")
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
        browser.find_element(By.ID, "token").send_keys("wrong-token-0123456789")
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        wait.until(lambda d: "refused" in d.find_element(By.ID, "login-error").text)
        assert not browser.find_element(By.ID, "main").is_displayed()

        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        row = '#jobs tr[data-job="watched"]'
        wait.until(lambda d: _text(d, row + " .done") not in ("", "0"))
        first = int(_text(browser, row + " .done"))
        # The list follows the stream: the done count grows with no reload.
        wait.until(lambda d: int(_text(d, row + " .done") or 0) > first + 2)
        assert _text(browser, row + " .state") == "running"
        # The token is kept in this tab and sent as a header, never in a URL.
        assert browser.execute_script(
            "return sessionStorage.getItem('distscrape-api-token')") == TOKEN
        urls = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert urls and not any(TOKEN in url for url in [browser.current_url, *urls])

        browser.find_element(By.CSS_SELECTOR, row).click()
        wait.until(lambda d: d.find_element(By.ID, "job").is_displayed())
        host = site.base_url.split("//")[1]
        wait.until(lambda d: _text(d, "#domains tbody td.domain") == host)
        wait.until(lambda d: d.find_element(By.ID, "figure-done").text not in ("", "0"))
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000

        browser.find_element(By.ID, "pause").click()
        wait.until(lambda d: tracker.job_info("watched").state is JobState.PAUSED)
        wait.until(lambda d: _text(d, "#job-state") == "paused")
        wait.until(lambda d: _text(d, row + " .state") == "paused")
        assert "running \u2192 paused" in _text(browser, "#action-result")
        assert not browser.find_element(By.ID, "pause").is_enabled()
        assert browser.find_element(By.ID, "resume").is_enabled()
        assert tracker.stats("watched").done < len(site_pages.reachable)

        browser.find_element(By.ID, "cancel").click()
        wait.until(lambda d: tracker.job_info("watched").state is JobState.CANCELLED)
        wait.until(lambda d: _text(d, "#job-state") == "cancelled")

        # A job of 10,000 domains: its table shows a page of them, pages on, and filters.
        wide = {"seeds": [f"http://d{i:05d}.invalid/" for i in range(10_000)],
                "scraper": {"same_host": False}, "saver": {"output": str(tmp_path / "wide")}}
        assert api.request("PUT", "/api/jobs/wide", wide)[0] == 201
        assert api.request("POST", "/api/jobs/wide/pause")[0] == 200
        wait.until(lambda d: _text(d, '#jobs tr[data-job="wide"] .state') == "paused")
        browser.execute_script("document.querySelector('#jobs tr[data-job=\"wide\"]').click()")
        wait.until(lambda d: _text(d, "#domains-page") == "1-100 of 10000")
        assert browser.execute_script("return document.querySelectorAll('#domains tbody tr').length") == 100
        browser.find_element(By.ID, "domain-sort").send_keys("by name")
        wait.until(lambda d: _text(d, "#domains tbody td.domain") == "d00000.invalid")
        browser.find_element(By.ID, "domains-next").click()
        wait.until(lambda d: _text(d, "#domains tbody td.domain") == "d00100.invalid")
        browser.find_element(By.ID, "domain-filter").send_keys("d0999")
        wait.until(lambda d: _text(d, "#domains-page") == "1-10 of 10")
        browser.save_screenshot(str(tmp_path / "wide.png"))

        # Signing out forgets the token: the next visit asks for it again.
        browser.find_element(By.ID, "logout").click()
        browser.get(api.url + "/")
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
        assert browser.execute_script(
            "return sessionStorage.getItem('distscrape-api-token')") is None
