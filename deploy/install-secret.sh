#!/usr/bin/env bash
# Install a secret file (the tpu_ssh private key, a service-account key JSON) from stdin into the
# `airflow-auth` volume, owned by the Airflow user (uid 50000) with mode 0400:
#
#   docker compose exec -T -u 0 airflow-scheduler bash /opt/airflow/deploy/install-secret.sh tpu_ssh_key < ~/.ssh/tpu
#
# Why: `docker compose cp` creates files owned by root with the source's mode (0600 for an SSH key),
# which the Airflow services (uid 50000) cannot read. Run as root (-u 0) so the owner can be set; the
# file is written under a temporary name and renamed, so a rerun replaces it and a reader never sees
# half a key. MLM_AUTH_DIR and MLM_AIRFLOW_UID exist for tests (tests/deploy/test_install_secret.py).
set -euo pipefail

name="${1:-}"
dir="${MLM_AUTH_DIR:-/opt/airflow/auth}"
owner="${MLM_AIRFLOW_UID:-50000}"
usage="usage: install-secret.sh NAME < FILE   (e.g. tpu_ssh_key < ~/.ssh/tpu)"

if [[ ! "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
    echo "install-secret: NAME must be a plain file name, got '${name}'. $usage" >&2
    exit 2
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install-secret: run as root to give the file to uid $owner: docker compose exec -T -u 0 ..." >&2
    exit 1
fi
if [[ -t 0 ]]; then
    echo "install-secret: pipe the file in on stdin (and pass -T to docker compose exec). $usage" >&2
    exit 2
fi

umask 077
tmp="$(mktemp "$dir/.$name.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
cat > "$tmp"
if [[ ! -s "$tmp" ]]; then
    echo "install-secret: stdin was empty: nothing installed. $usage" >&2
    exit 1
fi
chown "$owner:0" "$tmp"
chmod 0400 "$tmp"
mv -f "$tmp" "$dir/$name"
trap - EXIT
echo "install-secret: $dir/$name installed (owner uid $owner, mode 0400)"
