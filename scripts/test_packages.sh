#!/usr/bin/env bash
# The package tests (packaging/test_packages.py), as root: builds the Debian packages of
# scripts/package.sh for 15 and 17, installs each with dpkg into a Debian root of its own release
# (made once under /var/lib/pg_backfill, then reused), creates the extension and backfills in a
# new cluster there, runs a part of the installcheck against it, removes it and checks that
# nothing is left; and builds 18's extension image (scripts/package.sh --format image), unpacks it
# and serves a backfill from it to a PostgreSQL 18 server (packaging/test_image.py). Installs what
# building needs first (scripts/setup.sh for 15, 17 and 18). The arm64 packages: scripts/test_arm64.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PG_MAJOR=17 bash scripts/setup.sh
PG_MAJOR=18 bash scripts/setup.sh
python3 -m pytest packaging -p no:cacheprovider -q "$@"
