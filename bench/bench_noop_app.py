"""The app ``bench_task_overhead.py`` starts its worker with: ours, plus a task that does nothing."""

from distscrape_celery.worker.app import app


@app.task(name="distscrape.bench.noop", ignore_result=True)
def noop(*args) -> None:
    return None
