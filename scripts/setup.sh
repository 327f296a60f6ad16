#!/usr/bin/env bash
# Installs what building and testing pg_backfill needs on Debian 12, as root, for PostgreSQL
# PG_MAJOR (15 unless set; see lib/pg_major.sh). Debian's 15 is always installed: it is the default,
# and the 18 suite upgrades a 15 cluster. 17 is Debian 13's, in a Debian 13 root (pg_root.sh);
# 18 is built from source (build_postgres.sh); 19 is Debian experimental's, in a sid root
# (pg_root.sh). Also the Rust toolchain that rust-toolchain.toml names and cargo-pgrx.
# Idempotent: every step skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/pg_major.sh

PGRX_VERSION=0.19.4  # the pgrx of Cargo.toml
# (lintian: scripts/package.sh checks each package it builds with it; umoci makes its extension
# images, --format image.)
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-wal2json
              clang libclang-dev sudo pkg-config libssl-dev build-essential lintian umoci)
if [ "$PG_MAJOR" = 18 ]; then
    # What scripts/build_postgres.sh needs to build PostgreSQL from source, and Citus.
    APT_PACKAGES+=(bison flex libreadline-dev zlib1g-dev libicu-dev liblz4-dev libzstd-dev libkrb5-dev)
fi

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

# pgrx's Rust (rust-toolchain.toml): rustup installs a toolchain on first use only where automatic
# installs are on, and they may be off (RUSTUP_AUTO_INSTALL=0).
toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
if ! rustup toolchain list | grep -q "^$toolchain-"; then
    log "installing the Rust toolchain $toolchain (rustup)"
    rustup toolchain install "$toolchain" --profile minimal -c rustfmt -c clippy
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION"; then
    log "installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

if [ -n "$PG_ROOT" ]; then
    bash scripts/pg_root.sh "$PG_MAJOR"
elif [ "$PG_MAJOR" != 15 ]; then
    bash scripts/build_postgres.sh "$PG_MAJOR"
fi

# cargo pgrx init rewrites its config with only the versions it is given: give it every major
# installed, so that a run for one does not drop another.
init=()
missing_from_config=
for major in 15 17 18 19; do
    pg_config=$(pg_bin_of "$major")/pg_config
    [ -x "$pg_config" ] && "$pg_config" --version >/dev/null 2>&1 || continue
    init+=("--pg$major" "$pg_config")
    grep -qs "pg$major = \"$pg_config\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" || missing_from_config+=" $major"
done
if [ -n "$missing_from_config" ]; then
    log "pointing cargo-pgrx at PostgreSQL$missing_from_config"
    cargo pgrx init "${init[@]}"
fi
if ! python3 -c "import psycopg, psycopg2, pytest, xdist, xxhash" 2>/dev/null; then
    # (psycopg2 for its streaming replication client: the tests' consumer that applies a stream;
    # pytest-xdist runs the end-to-end tests on several workers, scripts/test.sh)
    log "installing the end-to-end test harness (psycopg, psycopg2, pytest, pytest-xdist, xxhash)"
    python3 -m pip install -q --disable-pip-version-check "psycopg[binary]>=3.1,<4" "psycopg2-binary>=2.9,<3" "pytest>=7,<9" "pytest-xdist>=3.5,<4" "xxhash>=3,<4" "pyyaml>=6,<7"
fi
# The end-to-end test of a real pgoutput client (pg_test/test_node_consumer.py): node and npm's
# pg-logical-replication, at the versions pg_test/node/package-lock.json pins.
if ! command -v npm >/dev/null; then
    log "installing node and npm (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq nodejs npm >/dev/null
fi
if [ ! -d pg_test/node/node_modules/pg-logical-replication ]; then
    log "installing the pgoutput client of the tests (npm ci in pg_test/node)"
    npm ci --prefix pg_test/node --no-audit --no-fund --loglevel=error >/dev/null
fi
log "ready"
