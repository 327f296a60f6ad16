# Throwaway PostgreSQL clusters (of PG_MAJOR, see pg_major.sh) for the demo, the end-to-end
# tests and the benchmark. Sourced, not run. PostgreSQL refuses to run as root, so the server
# runs as the postgres OS user; this script only needs to be run as root or as postgres.

source "$(dirname "${BASH_SOURCE[0]}")/pg_major.sh"

# as_postgres CMD...: runs a command as the postgres OS user.
as_postgres() {
    if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres -- "$@"; fi
}

# cluster_start DIR PORT [EXTRA_CONF] [INITDB_ARGS]: a fresh cluster in DIR on PORT, logical
# decoding on. (INITDB_ARGS is split on spaces.)
cluster_start() {
    local dir=$1 port=$2 extra=${3:-} initdb_args=${4:-}
    cluster_stop "$dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres: "$dir" 2>/dev/null || true
    # shellcheck disable=SC2086
    as_postgres "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync $initdb_args >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log"; return 1; }
    # Debian's 15 admits only the decoders listed in output_plugin_libraries (its own setting:
    # a server built from PostgreSQL's source has no such list, and would refuse the line).
    local plugins=
    if "$PG_BIN/postgres" --describe-config 2>/dev/null | grep -q '^output_plugin_libraries'; then
        plugins="output_plugin_libraries = 'pgoutput, test_decoding, wal2json'"
    fi
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = logical
max_worker_processes = 24
max_replication_slots = 16
max_wal_senders = 16
fsync = off
full_page_writes = off
shared_buffers = 256MB
max_wal_size = 4GB
log_line_prefix = '%m [%p] %b '
$plugins
$extra
CONF
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null ||
        { tail -20 "$dir/server.log"; return 1; }
}

# cluster_stop DIR: stops the cluster in DIR if one runs there.
cluster_stop() {
    local dir=$1
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}
