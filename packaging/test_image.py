"""The extension image of scripts/package.sh (--format image), used as CloudNativePG uses it.

The operator mounts the image (an image volume) at /extensions/<name> and points PostgreSQL 18's
extension_control_path at its share/ and dynamic_library_path at its lib/. Here: build the image of
this machine's architecture for 18, unpack it from the OCI image layout alone (index.json, the
manifest, the config and the layers, each blob checked against its digest), start a PostgreSQL 18
server with those two settings pointing into it and pg_backfill preloaded from it, CREATE EXTENSION,
and backfill a table through a slot with every row read once. The server must have taken the
extension's files from the image: this machine's PostgreSQL 18 may have pg_backfill installed too
(the suite installs it), so extension_control_path names the image's share/ alone, the image's lib/
comes first in dynamic_library_path, and the test checks that the library the server mapped is the
image's.

Run by scripts/test_packages.sh (CI's package part). PostgreSQL 18 is BACKFILL_PG_BIN's when set
(another installation of 18), else scripts/lib/pg_major.sh's; the port is BACKFILL_IMAGE_TEST_PORT's,
18592 unless set.
"""

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import psycopg
import pytest

from test_packages import HOST_ARCH, backfill_every_row_once, bash, cargo_version

MAJOR = 18
PORT = int(os.environ.get("BACKFILL_IMAGE_TEST_PORT", "18592"))
TEST_DIR = Path(os.environ.get("BACKFILL_IMAGE_TEST_DIR", "/tmp/pg_backfill_image18"))


@pytest.fixture(scope="module")
def image() -> Path:
    bash(f"bash scripts/package.sh --format image {MAJOR}")
    path = Path(__file__).resolve().parent.parent / "target" / "packages" / f"pg-backfill-{cargo_version()}-pg{MAJOR}-{HOST_ARCH}.oci.tar"
    assert path.exists(), f"scripts/package.sh made no {path.name}"
    return path


def blob(layout: tarfile.TarFile, descriptor: dict) -> bytes:
    """A blob of the layout, checked against its descriptor's digest and size."""
    algorithm, digest = descriptor["digest"].split(":")
    data = layout.extractfile(f"./blobs/{algorithm}/{digest}").read()
    assert hashlib.new(algorithm, data).hexdigest() == digest and len(data) == descriptor["size"]
    return data


def unpack(archive: Path, tag: str, into: Path) -> dict:
    """The image TAG of the OCI image layout ARCHIVE, its layers applied in order into INTO, as a
    container runtime does; its config returned."""
    with tarfile.open(archive) as layout:
        assert json.loads(layout.extractfile("./oci-layout").read())["imageLayoutVersion"] == "1.0.0"
        index = json.loads(layout.extractfile("./index.json").read())
        [descriptor] = [m for m in index["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
        assert descriptor["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        manifest = json.loads(blob(layout, descriptor))
        config = json.loads(blob(layout, manifest["config"]))
        for layer in manifest["layers"]:
            assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
            with tarfile.open(fileobj=io.BytesIO(blob(layout, layer)), mode="r:gz") as files:
                files.extractall(into, filter="data")
    return config


def test_the_image_unpacked_serves_a_backfill_to_postgresql_18_pointed_at_it(image):
    version = cargo_version()
    mount = TEST_DIR / "extensions" / "pg_backfill"  # where the operator mounts it
    bash(f"rm -rf '{TEST_DIR}' && mkdir -p '{mount}'")
    config = unpack(image, f"{version}-pg{MAJOR}", mount)
    assert config["architecture"] == HOST_ARCH and config["os"] == "linux"
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == version
    files = sorted(str(p.relative_to(mount)) for p in mount.rglob("*") if p.is_file())
    assert "lib/pg_backfill.so" in files
    assert "share/extension/pg_backfill.control" in files
    assert f"share/extension/pg_backfill--{version}.sql" in files
    assert [f for f in files if not f.startswith(("lib/", "share/extension/pg_backfill", "licenses/pg_backfill/"))] == []
    # The server runs as postgres: the image's files are read-only to it, as a mounted image's are.
    subprocess.run(["chmod", "-R", "a+rX", str(TEST_DIR)], check=True)

    # The image's share/ alone (the operator puts it after $system): the control and SQL files
    # can then only be the image's. Its lib/ before $libdir, and the library mapped checked below.
    conf = (f"extension_control_path = '{mount}/share'\n"
            f"dynamic_library_path = '{mount}/lib:$libdir'\n"
            "shared_preload_libraries = 'pg_backfill'")
    env = {"PG_MAJOR": str(MAJOR), "IMAGE_CONF": conf}  # (in the environment: "$system" stays as it is)
    if "BACKFILL_PG_BIN" in os.environ:
        env["BACKFILL_PG_BIN"] = os.environ["BACKFILL_PG_BIN"]
    cluster = TEST_DIR / "cluster"
    bash(f"source scripts/lib/cluster.sh && cluster_start '{cluster}' {PORT} \"$IMAGE_CONF\"", env=env)
    try:
        backfill_every_row_once(PORT)
        with psycopg.connect(host="127.0.0.1", port=PORT, user="postgres", dbname="postgres", autocommit=True) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            conn.execute("SELECT count(*) FROM backfill_status")  # calls into the library
            mapped = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                      if line.rstrip().endswith("pg_backfill.so")}
            extversion = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_backfill'").fetchone()[0]
        assert mapped == {f"{mount}/lib/pg_backfill.so"}, f"the server mapped {mapped}, not the image's library"
        assert extversion == version
    finally:
        bash(f"source scripts/lib/cluster.sh && cluster_stop '{cluster}'", env=env)
