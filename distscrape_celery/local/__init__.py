"""The one-command crawl on one machine: worker processes and an embedded Redis."""
