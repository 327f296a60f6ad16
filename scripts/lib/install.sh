# Installing pg_backfill into a PostgreSQL installation that may be running. Sourced, not run.
#
# `cargo pgrx install` (and the install step of `cargo pgrx test`) copies the new library over
# the installed file in place: every process that has the old one mapped then reads new bytes
# at old offsets, and crashes (seen: "trap invalid opcode ... in pg_backfill.so", a segfault;
# with the library preloaded, crash recovery then failed and the server stayed down). A package
# manager writes a new file and renames it over the old one instead: processes keep the old
# file, which disappears when the last of them exits, and new ones load the new file. These
# functions do the same.
#
# Files go where PG_MAJOR's pg_config says, under PG_ROOT (pg_major.sh): for a major that runs
# in a Debian root (17), inside that root.
source "$(dirname "${BASH_SOURCE[0]}")/pg_major.sh"

# install_extension PG_CONFIG [cargo pgrx package options...]: builds the extension (release)
# into a package directory, then moves each of its files into place by rename.
install_extension() {
    local pg_config=$1
    shift
    local stage
    stage=$(mktemp -d "${TMPDIR:-/tmp}/pg_backfill_package.XXXXXX")
    cargo pgrx package --pg-config "$pg_config" --out-dir "$stage" "$@" >"$stage.log" 2>&1 ||
        { cat "$stage.log"; rm -rf "$stage" "$stage.log"; return 1; }
    install_package_files "$stage"
    rm -rf "$stage" "$stage.log"
}

# install_package_files DIR: every file under DIR (a `cargo pgrx package` tree) to its place
# under PG_ROOT (/ on the host), each written beside its destination and renamed over it.
install_package_files() {
    local stage=$1 file destination
    while IFS= read -r -d '' file; do
        destination=$PG_ROOT/${file#"$stage"/}
        mkdir -p "$(dirname "$destination")"
        cp "$file" "$destination.new.$$"
        chmod 0644 "$destination.new.$$"
        mv -f "$destination.new.$$" "$destination"
    done < <(find "$stage" -type f -print0)
}

# retire_installed_library PG_CONFIG: unlinks the installed library, so that a tool that then
# copies a new one in place (`cargo pgrx test`) writes a new file, not the mapped one.
retire_installed_library() {
    local library
    library="$PG_ROOT$("$1" --pkglibdir)/pg_backfill.so"
    if [ -f "$library" ]; then
        mv -f "$library" "$library.retired.$$"
        rm -f "$library.retired.$$"
    fi
}
