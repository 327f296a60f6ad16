#!/usr/bin/env bash
# The arm64 package tests, as root: scripts/package.sh --arch arm64 builds the arm64 packages of 15
# and 17 (cross-compiled on this amd64 machine), and packaging/test_packages.py with
# PACKAGE_ARCH=arm64 installs each with dpkg into an arm64 Debian root of its own release
# (/var/lib/pg_backfill/arm64-bookworm for 15, arm64-trixie for 17: made once by debootstrap
# --arch arm64, then reused), creates the extension and backfills a table through a slot in a new
# cluster there, every row read once, removes it and checks that nothing is left. Every program in
# those roots, PostgreSQL's server too, runs under Debian's qemu-user-static (registered with
# binfmt_misc by scripts/lib/debian_root.sh): several times slower than natively, which is why this
# is a script of its own and not a part of .ci/run (see docs/installing.md). Installs what building needs
# first (scripts/setup.sh for 15 and 17: the SQL files come from their amd64 builds).
#
#   bash scripts/test_arm64.sh [pytest arguments]
#
# BACKFILL_PACKAGE_TEST_PORT: the first of two ports for the clusters (15595 and 17595 unless set).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
PG_MAJOR=17 bash scripts/setup.sh
echo "== setup took $((SECONDS - started)) s =="
started=$SECONDS
PACKAGE_ARCH=arm64 python3 -m pytest packaging/test_packages.py -p no:cacheprovider -q --durations=0 "$@"
echo "== the arm64 package tests took $((SECONDS - started)) s =="
