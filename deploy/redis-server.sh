#!/usr/bin/env bash
# Redis for the `celery` profile (the `redis` service of docker-compose.yaml mounts this file; and
# tests/peers/redis_server.py runs it): the password reaches Redis in an ACL file holding only its
# SHA-256, written here at each start from REDIS_PASSWORD, so it is on no command line (`--requirepass`
# would show it to `ps` and /proc/<pid>/cmdline) and in no environment of the server process.
# The append-only file keeps queued tasks across a Redis restart. Extra arguments go to redis-server
# after the config file (they win: the tests pass --port, --bind, --dir).
#
#   MLM_REDIS_RUN_DIR   where redis.conf and users.acl go (default /run/redis, inside the container)
set -euo pipefail

if [[ -z "${REDIS_PASSWORD:-}" ]]; then
    echo "redis-server.sh: REDIS_PASSWORD is empty: set it in .env (.env.example shows how)" >&2
    exit 1
fi
run="${MLM_REDIS_RUN_DIR:-/run/redis}"
umask 077
mkdir -p "$run"
# printf is a shell builtin: the password is piped to sha256sum, not passed as an argument.
hash="$(printf '%s' "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)"
unset REDIS_PASSWORD
# What Celery's broker needs (keys, lists, sorted sets, pub/sub, transactions, and kombu's lock, a
# registered Lua script run by EVALSHA after SCRIPT LOAD), none of what would let a worker's task code
# reconfigure, flush or dump the server: -@dangerous takes CONFIG, FLUSHALL, DEBUG, KEYS, MONITOR,
# SHUTDOWN, ACL, MODULE, SAVE and the like; -@scripting takes EVAL, FUNCTION and SCRIPT FLUSH/KILL. A
# script runs under its caller's ACL, so the two kept back grant no command the user lacks.
printf 'user default on #%s ~* &* +@all -@dangerous -@scripting +evalsha +script|load\n' "$hash" > "$run/users.acl"
printf 'appendonly yes\naclfile %s/users.acl\n' "$run" > "$run/redis.conf"

if [[ "$(id -u)" == 0 ]] && command -v docker-entrypoint.sh >/dev/null; then
    # The official image's entrypoint drops from root to the `redis` user (gosu) before starting.
    chown -R redis "$run"
    exec docker-entrypoint.sh redis-server "$run/redis.conf" "$@"
fi
exec redis-server "$run/redis.conf" "$@"
