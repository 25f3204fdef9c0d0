#!/usr/bin/env bash
# Start one distscrape worker on this host, reading its settings from an env file.
#   workers/start-worker.sh [ENV_FILE]     (default: /etc/distscrape/worker.env)
# Runs in the foreground (for systemd, supervisord or a terminal); SIGTERM is a warm shutdown.
# The node name is distscrape-$WORKER_NAME@HOST: the systemd unit sets WORKER_NAME to its
# instance (distscrape-worker@2 -> distscrape-2@HOST); unset, this process's PID keeps two
# workers on one host apart (Flower and Celery's remote control need distinct names).
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
events=()
# Task events cost about a quarter more CPU per page with the threads pool (docs/performance.md), and
# Flower turns them on in every worker while it runs; WORKER_EVENTS=1 sends them from the start.
if [[ "${WORKER_EVENTS:-0}" != 0 ]]; then events=(-E); fi
exec "$python" -m celery -A distscrape_celery worker \
  -Q distscrape.scrape,distscrape.save \
  -P "${WORKER_POOL:-threads}" -c "${WORKER_CONCURRENCY:-32}" \
  -n "distscrape-${WORKER_NAME:-$$}@%h" ${events[@]+"${events[@]}"} \
  --without-gossip --without-mingle \
  --loglevel "${WORKER_LOGLEVEL:-INFO}"
