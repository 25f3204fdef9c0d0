"""The item's life without Celery: components, pipeline, batching, backoff, crawl manager."""
