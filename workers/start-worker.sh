#!/usr/bin/env bash
# Start one distscrape worker on this host, reading its settings from an env file.
#   workers/start-worker.sh [ENV_FILE]     (default: /etc/distscrape/worker.env)
# Runs in the foreground (for systemd, supervisord or a terminal); SIGTERM is a warm shutdown.
set -euo pipefail
env_file=${1:-/etc/distscrape/worker.env}
if [[ -f "$env_file" ]]; then
  set -a
  # shellcheck disable=SC1090
  . "$env_file"
  set +a
fi
: "${DISTSCRAPE_REDIS_URL:?set DISTSCRAPE_REDIS_URL (see workers/worker.env.example)}"
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
exec "$python" -m celery -A distscrape_celery worker \
  -Q distscrape.scrape,distscrape.save \
  -P "${WORKER_POOL:-prefork}" -c "${WORKER_CONCURRENCY:-8}" \
  -n "distscrape-$(hostname -s)-$$@%h" --loglevel "${WORKER_LOGLEVEL:-INFO}"
