#!/usr/bin/env bash
# Start one distscrape worker on this host, reading its settings from an env file.
#   workers/start-worker.sh [ENV_FILE]     (default: /etc/distscrape/worker.env)
# Runs in the foreground (for systemd, supervisord or a terminal); SIGTERM is a warm shutdown.
# The node name is distscrape-$WORKER_NAME@HOST: the systemd unit sets WORKER_NAME to its
# instance (distscrape-worker@2 -> distscrape-2@HOST); unset, this process's PID keeps two
# workers on one host apart (Flower and Celery's remote control need distinct names).
set -euo pipefail
env_file=${1:-/etc/distscrape/worker.env}
# Under systemd, EnvironmentFile= has already put the file's settings in our environment, and the
# file stays root-owned 0600 (it holds the Redis password) while we run as the unprivileged user:
# read it only when we can (run by hand, or by its owner). Never make it readable by others to
# get past this: every local user could then read the password.
if [[ -f "$env_file" && -r "$env_file" ]]; then
  set -a
  # shellcheck disable=SC1090
  . "$env_file"
  set +a
fi
if [[ -z "${DISTSCRAPE_REDIS_URL:-}" && -f "$env_file" && ! -r "$env_file" ]]; then
  echo "start-worker.sh: $env_file is not readable by $(id -un) and DISTSCRAPE_REDIS_URL is unset: load it with systemd's EnvironmentFile= (see workers/distscrape-worker@.service), or run as its owner" >&2
  exit 1
fi
: "${DISTSCRAPE_REDIS_URL:?set DISTSCRAPE_REDIS_URL (see workers/worker.env.example)}"
# No user site: a file written into ~/.local/lib/pythonX.Y/site-packages must never run here.
export PYTHONNOUSERSITE=${PYTHONNOUSERSITE:-1}
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
