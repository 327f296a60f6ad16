#!/usr/bin/env bash
# The package tests (packaging/test_packages.py), as root: builds the Debian packages of
# scripts/package.sh for 15 and 17, installs each with dpkg into a Debian root of its own release
# (made once under /var/lib/pg_backfill, then reused), creates the extension and backfills in a
# new cluster there, runs a part of the installcheck against it, removes it and checks that
# nothing is left. Installs what building needs first (scripts/setup.sh for 15 and 17).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PG_MAJOR=17 bash scripts/setup.sh
python3 -m pytest packaging -p no:cacheprovider -q "$@"
