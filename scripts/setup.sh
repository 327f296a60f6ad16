#!/usr/bin/env bash
# Installs what building and testing pg_backfill needs on Debian 12, as root.
# Idempotent: every step skips what is already there.
set -euo pipefail

PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-wal2json
              clang libclang-dev sudo pkg-config libssl-dev build-essential)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Debian's postgresql-common would create and start a "main" cluster; we run our own.
    mkdir -p /etc/postgresql-common
    grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf ||
        echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION"; then
    log "installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

if ! grep -qs "pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    log "pointing cargo-pgrx at the system PostgreSQL 15"
    cargo pgrx init --pg15 "$PG_CONFIG"
fi
if ! python3 -c "import psycopg, psycopg2, pytest, xxhash" 2>/dev/null; then
    # (psycopg2 for its streaming replication client: the tests' consumer that applies a stream)
    log "installing the end-to-end test harness (psycopg, psycopg2, pytest, xxhash)"
    python3 -m pip install -q --disable-pip-version-check "psycopg[binary]>=3.1,<4" "psycopg2-binary>=2.9,<3" "pytest>=7,<9" "xxhash>=3,<4"
fi
log "ready"
