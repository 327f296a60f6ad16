"""The Debian packages of scripts/package.sh, installed as a DBA installs them.

For each major with a Debian system to install into: build the package, `dpkg -i` it into a Debian
root of the release that ships that major's postgresql-<major> (15: Debian 12's, in a bookworm root;
17: Debian 13's, in a trixie root), start a new cluster there with pg_backfill preloaded,
`CREATE EXTENSION`, backfill a table (every row once), run a part of the installcheck against it,
then `dpkg -r` and find nothing of the package left. The roots (scripts/lib/debian_root.sh) are the
package tests' own, apart from the system's PostgreSQL 15 and 17's development root, whose servers
may be running: a package installed there would replace their files, and its removal would take
the development install with it. Made once under /var/lib/pg_backfill, reused by later runs.

Run with `bash scripts/test_packages.sh` (as root: dpkg and the roots need it). 18's package is built
but not installed here: Debian 12 has no postgresql-18 package.

With PACKAGE_ARCH=arm64 (scripts/test_arm64.sh), the same for the arm64 packages (scripts/package.sh
--arch arm64), in arm64 Debian roots of their own (arm64-bookworm, arm64-trixie) whose programs, the
server's too, run under qemu-user-static: the package is installed, the extension created, a table
backfilled through a slot with every row read once, the package removed. The installcheck's part is
left out there: under emulation it would take several times the half hour it takes natively, and
what it checks does not depend on the architecture.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOTS_DIR = Path("/var/lib/pg_backfill")
# major: the Debian release whose postgresql-<major> the package installs onto.
SUITES = {15: "bookworm", 17: "trixie"}
HOST_ARCH = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()
# The architecture of the packages tested: the host's, or arm64 (emulated).
ARCH = os.environ.get("PACKAGE_ARCH", HOST_ARCH)
EMULATED = ARCH != HOST_ARCH
# The part of the installcheck (scripts/test.sh --installed) each package runs: the API, ordering
# under concurrent writes, resuming, security, and the decoders (the whole installcheck takes
# about as long as the suite: .ci/run runs it on the development builds).
INSTALLCHECK = ["pg_test/test_api.py", "pg_test/test_ordering.py", "pg_test/test_resume.py",
                "pg_test/test_decoders.py", "-m", "not slow"]
ROWS = 20_000


def bash(script: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], check=True, cwd=ROOT, env={**os.environ, **(env or {})}, **kw)


def cargo_version() -> str:
    return bash("sed -n 's/^version = \"\\(.*\\)\"$/\\1/p' Cargo.toml | head -1", capture_output=True, text=True).stdout.strip()


class DebianRoot:
    """A Debian root with Debian's postgresql-<major> and wal2json, its programs in a bin directory
    of wrappers (scripts/lib/debian_root.sh), its clusters on ports of their own: the major times 1,000
    plus 590, and 600 and up for the installcheck's."""

    def __init__(self, major: int):
        self.major, self.suite = major, SUITES[major]
        prefix = f"{ARCH}-" if EMULATED else "package-test-"
        self.dir = ROOTS_DIR / f"{prefix}{self.suite}"
        self.bin = ROOTS_DIR / f"{prefix}{major}" / "bin"
        # (BACKFILL_PACKAGE_TEST_PORT: the first of a range of ports of one's own, one a major.)
        base = os.environ.get("BACKFILL_PACKAGE_TEST_PORT")
        self.port = int(base) + major - 15 if base else major * 1000 + (595 if EMULATED else 590)
        self.cluster_dir = f"/tmp/pg_backfill_package{major}{'_' + ARCH if EMULATED else ''}"

    def make(self) -> None:
        arch = f"DEBIAN_ROOT_ARCH={ARCH} " if EMULATED else ""
        bash(f"source scripts/lib/debian_root.sh && {arch}debian_root_make '{self.dir}' {self.suite} postgresql-{self.major} "
             f"postgresql-{self.major}-wal2json && debian_root_mount '{self.dir}' && "
             f"debian_root_programs '{self.dir}' {self.major} '{self.bin}'")

    def env(self) -> dict:
        return {"PG_MAJOR": str(self.major), "BACKFILL_PG_BIN": str(self.bin), "BACKFILL_PG_ROOT": str(self.dir)}

    def run(self, *command: str, **kw) -> subprocess.CompletedProcess:
        """A command as root inside the root."""
        return subprocess.run(["chroot", str(self.dir), *command], check=True, capture_output=True, text=True, **kw)

    def installed(self, package: str) -> bool:
        result = subprocess.run(["chroot", str(self.dir), "dpkg-query", "-W", "-f=${Status}", package],
                                capture_output=True, text=True)
        return "install ok installed" in result.stdout

    def files_named_pg_backfill(self) -> list[str]:
        found = subprocess.run(["chroot", str(self.dir), "find", "/usr", "/etc", "/var/lib/dpkg/info", "-name", "*pg_backfill*",
                                "-o", "-name", "*pg-backfill*"], capture_output=True, text=True).stdout
        # (Not the root's own apt setting that scripts/lib/debian_root.sh writes, 99pg_backfill-snapshot.)
        return sorted(f for f in found.split() if not f.startswith("/etc/apt/"))

    def cluster(self, command: str) -> None:
        bash(f"source scripts/lib/cluster.sh && {command}", env=self.env())


@pytest.fixture(scope="module")
def packages():
    """scripts/package.sh's packages of the majors tested here: major -> .deb path."""
    bash(f"bash scripts/package.sh --arch {ARCH} {' '.join(map(str, SUITES))}")
    version = cargo_version()
    return {major: ROOT / "target" / "packages" / f"postgresql-{major}-pg-backfill_{version}-1_{ARCH}.deb"
            for major in SUITES}


def deb_field(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("major", sorted(SUITES))
def test_the_package_says_what_it_is_and_holds_only_the_extension(packages, major):
    deb = packages[major]
    assert deb.exists(), f"scripts/package.sh made no {deb.name}"
    name = f"postgresql-{major}-pg-backfill"
    assert deb_field(deb, "Package") == name
    assert deb_field(deb, "Version") == f"{cargo_version()}-1"
    assert deb_field(deb, "Architecture") == ARCH
    # The server of its major (versioned when the library calls a function a minor release added:
    # scripts/package.sh), then the shared libraries dpkg-shlibdeps finds.
    server, *shlibs = deb_field(deb, "Depends").split(", ")
    assert server == f"postgresql-{major}" or server.startswith(f"postgresql-{major} (>= {major}.")
    assert any(d.startswith("libc6 (>= ") for d in shlibs)
    assert deb_field(deb, "Maintainer") and deb_field(deb, "Description")
    listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
    files = sorted(subprocess.run(["tar", "-t"], input=listing, check=True, capture_output=True).stdout.decode().split())
    files = [f for f in files if not f.endswith("/")]
    assert f"./usr/lib/postgresql/{major}/lib/pg_backfill.so" in files
    assert f"./usr/share/postgresql/{major}/extension/pg_backfill.control" in files
    assert f"./usr/share/postgresql/{major}/extension/pg_backfill--{cargo_version()}.sql" in files
    assert f"./usr/share/doc/{name}/copyright" in files
    assert f"./usr/share/doc/{name}/changelog.Debian.gz" in files
    outside = [f for f in files if not f.startswith((f"./usr/lib/postgresql/{major}/lib/",
                                                     f"./usr/share/postgresql/{major}/extension/pg_backfill",
                                                     f"./usr/share/doc/{name}/"))]
    assert outside == [f"./usr/share/lintian/overrides/{name}"]
    copyright_text = subprocess.run(["tar", "-xO", f"./usr/share/doc/{name}/copyright"], input=listing,
                                    check=True, capture_output=True).stdout.decode()
    assert "License: PostgreSQL" in copyright_text
    # A release build: no test hook.
    library = subprocess.run(["tar", "-xO", f"./usr/lib/postgresql/{major}/lib/pg_backfill.so"], input=listing,
                             check=True, capture_output=True).stdout
    assert b"test_skip_row_locks" not in library
    # Stripped, as Debian's packages are: no symbol table (its dynamic symbols stay).
    with tempfile.NamedTemporaryFile(suffix=".so") as copy:
        copy.write(library)
        copy.flush()
        sections = subprocess.run(["readelf", "-S", "-W", copy.name], check=True, capture_output=True, text=True).stdout
        header = subprocess.run(["readelf", "-h", copy.name], check=True, capture_output=True, text=True).stdout
    assert " .symtab " not in sections and " .dynsym " in sections
    # The architecture's machine code (arm64's is AArch64's: cross-compiled).
    assert {"amd64": "X86-64", "arm64": "AArch64"}[ARCH] in header


@pytest.mark.parametrize("major", sorted(SUITES))
def test_installed_it_backfills_in_a_new_cluster_and_removed_it_leaves_nothing(packages, major):
    root = DebianRoot(major)
    root.make()
    name = f"postgresql-{major}-pg-backfill"
    if root.installed(name):  # left by an interrupted run
        root.run("dpkg", "-r", name)
    assert root.files_named_pg_backfill() == [], "the test root holds pg_backfill files before the package"
    # The root's /tmp is the host's: dpkg reads the package there.
    with tempfile.TemporaryDirectory(dir="/tmp") as carried:
        deb = shutil.copy(packages[major], carried)
        root.run("dpkg", "-i", deb)
    owned_files = [f for f in root.run("dpkg", "-L", name).stdout.split() if Path(f"{root.dir}{f}").is_file()]
    assert f"/usr/lib/postgresql/{major}/lib/pg_backfill.so" in owned_files
    try:
        root.cluster(f"cluster_start '{root.cluster_dir}' {root.port} \"shared_preload_libraries = 'pg_backfill'\"")
        try:
            backfill_every_row_once(root.port)
        finally:
            root.cluster(f"cluster_stop '{root.cluster_dir}'")
        # The installcheck's part, against the package's files (natively only: see the top).
        if not EMULATED:
            bash(f"bash scripts/test.sh --installed -x {' '.join(repr(a) for a in INSTALLCHECK)}",
                 env={**root.env(), "BACKFILL_TEST_DIR": f"/tmp/pg_backfill_package_installcheck{major}",
                      "BACKFILL_TEST_PORT": str(major * 1000 + 600)})
    finally:
        root.run("dpkg", "-r", name)
    assert not root.installed(name)
    assert [f for f in owned_files if Path(f"{root.dir}{f}").exists()] == []
    assert root.files_named_pg_backfill() == []


def backfill_every_row_once(port: int) -> None:
    """CREATE EXTENSION in the new cluster, then a backfill of a table into a wal2json slot: each
    row read exactly once, between the start and end markers."""
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_backfill")
        conn.execute(f"CREATE TABLE items (id bigint PRIMARY KEY, body text NOT NULL);"
                     f"INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g")
        conn.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
        backfill_id = conn.execute("SELECT backfill_start('items', confirm => true)").fetchone()[0]
        # (A generous bound, only so that a backfill that never ends fails the test: emulated,
        # the server runs several times slower.)
        deadline = time.monotonic() + (1800 if EMULATED else 120)
        while (state := conn.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]) in (
                "running", "paused"):
            assert time.monotonic() < deadline, "the backfill did not end in time"
            time.sleep(0.1)
        assert state == "done"
        rows = conn.execute("SELECT data FROM pg_logical_slot_get_changes('consumer', NULL, NULL, 'format-version', '2')").fetchall()
    messages = [json.loads(json.loads(data)["content"]) for data, in rows
                if json.loads(data).get("action") == "M" and json.loads(data).get("prefix") == "backfill"]
    reads = []
    for m in messages:
        reads += [row["data"]["id"] for row in m["rows"]] if m["op"] == "reads" else [m["data"]["id"]] if m["op"] == "read" else []
    assert sorted(reads) == list(range(1, ROWS + 1))
    assert [m["op"] for m in messages if m["op"] not in ("read", "reads")] == ["table_start", "table_end"]
