"""The Celery side: the app, its tasks, and what a worker process runs beside them."""
