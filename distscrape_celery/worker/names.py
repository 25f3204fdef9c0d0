"""The names workers and publishers agree on: queues, tasks, and the layout of a save task's
arguments. A leaf module, so that the app, its tasks and the agent all import it and not each
other."""

from __future__ import annotations

from typing import Any

# The queues' names with the default queue_prefix (settings.scrape_queue and save_queue).
SCRAPE_QUEUE = "distscrape.scrape"
SAVE_QUEUE = "distscrape.save"
SCRAPE_TASK = "distscrape.scrape"
SAVE_TASK = "distscrape.save"
# The saves of several pages, scraped by one worker process, in one message.
SAVE_BATCH_TASK = "distscrape.save_batch"


def save_pairs(task: str, args: Any) -> list[tuple[str, int]]:
    """(item, token) of each save a save task's arguments carry: one for SAVE_TASK (job, item,
    token, meta), several for SAVE_BATCH_TASK (job, [[item, token, meta], ...])."""
    if task == SAVE_BATCH_TASK:
        return [(item, int(token)) for item, token, _ in args[1]]
    return [(args[1], int(args[2]))]
