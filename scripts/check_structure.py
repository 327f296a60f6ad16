"""Keeps the layout of src/: folders in a layer order, each importing only from folders below
it (or beside it, without a circle), modules importing each other in no circle (unit tests
included), no `impl` of a type outside the folder that defines it, lib.rs's map naming every
module, and one file (catalog/schema.rs) asking which of pg_backfill's own tables and columns
the installed schema has. api/ only adapts SQL to requests: it makes no SPI call, and none of
its functions is over 60 lines. What a publication holds is read under selection/ only (the
catalogs pg_publication_rel, pg_publication_namespace and pg_publication_tables; pg/compat.rs's
version shims aside). No function pointer crosses a layer (a lower layer calling up through
one): outside pg/, no `OnceLock<fn` and no `: fn(`. A file past about 450 lines is pointed out,
not refused: the layers, not a line count, decide where code goes."""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
# Lowest first; folders of one rank may import each other, as long as no circle forms.
LAYERS = [
    ["pg"], ["model"], ["selection"], ["catalog"], ["stream", "throttle", "verify"], ["worker"], ["citus"],
    ["start"], ["follow"], ["api"],
]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}
LINE_HINT = 450


def code(path: Path) -> str:
    """The file without its unit tests (which may import anything)."""
    return re.split(r"#\[cfg\(any\(test", path.read_text())[0]


def folder_of(path: Path) -> str:
    return path.relative_to(SRC).parts[0]


files = [p for p in SRC.rglob("*.rs") if p.parent != SRC]
problems, notes = [], []

unknown = sorted({folder_of(p) for p in files} - set(RANK))
problems += [f"src/{f}/ is in no layer of scripts/check_structure.py" for f in unknown]

# Imports: crate::<folder>::<module>.
imports = {p: set(re.findall(r"crate::(\w+)::(\w+)", code(p))) for p in files}
folder_graph = {}
for path, used in imports.items():
    here = folder_of(path)
    for folder, module in used:
        if folder not in RANK or here not in RANK:
            continue
        if RANK[folder] > RANK[here]:
            problems.append(f"src/{path.relative_to(SRC)} imports {folder}::{module}: {folder}/ is above {here}/")
        if folder != here:
            folder_graph.setdefault(here, set()).add(folder)


def cycle_in(graph):
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return None


if cycle := cycle_in(folder_graph):
    problems.append("folders import each other: " + " -> ".join(cycle))
# Modules, unit tests included: a test's import closes a circle as any other does (errors.rs's
# test called args.rs, which raises through errors.rs). (Layers leave tests out: they may use
# anything.)
module_graph = {}
for path in files:
    used = set(re.findall(r"crate::(\w+)::(\w+)", path.read_text()))
    name = f"{folder_of(path)}::{path.stem}"
    module_graph[name] = {f"{f}::{m}" for f, m in used if f"{f}::{m}" != name and (SRC / f / f"{m}.rs").exists()}
if cycle := cycle_in(module_graph):
    problems.append("modules import each other: " + " -> ".join(cycle))

# impl blocks live with their type: in the folder (worker/scan/, say) of the file that defines it.
defined = {}
for path in files:
    for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum)\s+(\w+)", path.read_text(), re.M):
        defined.setdefault(name, set()).add(path.parent)
for path in files:
    for name in re.findall(r"^impl(?:<[^>]*>)?\s+(?:[\w:<>', ]+\s+for\s+)?(?:\w+::)*(\w+)", code(path), re.M):
        if name in defined and path.parent not in defined[name]:
            homes = ", ".join(f"src/{d.relative_to(SRC)}/" for d in sorted(defined[name]))
            problems.append(f"src/{path.relative_to(SRC)} has an impl of {name}, defined in {homes}")

# The installed schema: what it has is asked in catalog/schema.rs only (its Capabilities). No
# other file probes the catalog for pg_backfill's own tables or columns, reads a row through
# to_jsonb to tolerate a missing column, or names a version of the extension.
SCHEMA_SEAM = SRC / "catalog" / "schema.rs"
LITERAL = re.compile(r'r(#*)"(.*?)"\1|b?\'(?:\\.|[^\\\'])\'|b?"((?:\\.|[^"\\])*)"', re.S)
SQL_PROBES = [
    (re.compile(r"to_regclass\(\s*'backfill\.", re.I), "looks up one of pg_backfill's relations (to_regclass)"),
    (re.compile(r"'backfill\.\w+'::(?:pg_catalog\.)?regclass", re.I), "looks up one of pg_backfill's relations (::regclass)"),
    (re.compile(r"pg_attribute.*backfill\.|backfill\..*pg_attribute", re.I | re.S), "reads the columns of one of pg_backfill's relations (pg_attribute)"),
    (re.compile(r"to_jsonb\(\s*\w+\s*\).*backfill\.|backfill\..*to_jsonb\(\s*\w+\s*\)", re.I | re.S), "reads a state table's row through to_jsonb"),
    (re.compile(r"'waiting%'"), "matches an older version's pause reason"),
]
VERSION = re.compile(r"\b0\.\d+\.\d+\b")


def without_comments(text: str) -> str:
    """Rust code without its line comments (`//`, `///`, `//!`): what they say is free."""
    return re.sub(r"^\s*//.*$", "", text, flags=re.M)


def schema_probes(path: Path):
    """(line, what) of each probe of the installed schema in a file."""
    text = without_comments(path.read_text())

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    for match in LITERAL.finditer(text):
        literal = match.group(2) if match.group(2) is not None else match.group(3) or ""
        for probe, what in SQL_PROBES:
            if probe.search(literal):
                yield line_of(match.start()), what
    for match in VERSION.finditer(text):
        yield line_of(match.start()), "names a version of pg_backfill"


for path in files:
    if path != SCHEMA_SEAM:
        for line, what in sorted(set(schema_probes(path))):
            problems.append(f"src/{path.relative_to(SRC)}:{line} {what}: ask catalog/schema.rs (its Capabilities)")

# api/ adapts SQL to requests: no SPI call, and short functions (the work is in the rooms below).
API_SPI = re.compile(r"\bSpi::|\bspi::(?!quote_|Error\b)|\bselect_one\w*\(|\brun_prepared\(|\bclient\.(?:select|update)\(")
API_FUNCTION_LINES = 60
FN_START = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def functions(text: str):
    """(name, first line, length in lines) of each function of a file, by its indentation: from
    its `fn` line to the first line after it that closes at that indentation."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not (match := FN_START.match(line)) or line.rstrip().endswith(";"):
            continue
        indent = match.group(1)
        for j in range(i, len(lines)):
            if lines[j].startswith(indent + "}") or (j == i and line.rstrip().endswith("}")):
                yield match.group(2), i + 1, j - i + 1
                break


for path in files:
    if folder_of(path) != "api":
        continue
    text = without_comments(code(path))
    for number, line in enumerate(text.splitlines(), 1):
        if API_SPI.search(line):
            problems.append(f"src/{path.relative_to(SRC)}:{number} makes an SPI call: api/ only adapts SQL to requests")
    for name, first, length in functions(code(path)):
        if length > API_FUNCTION_LINES:
            problems.append(f"src/{path.relative_to(SRC)}:{first} fn {name} has {length} lines: api/'s functions have "
                            f"at most {API_FUNCTION_LINES}")

# What a publication holds: read under selection/ only (selection/publication.rs), by one rule.
# (A catalog named as a regclass, as a DDL command's class, is not a read of it.)
PUBLICATION_CATALOGS = re.compile(r"\bpg_publication_(?:rel|namespace|tables)\b(?!'::)")
for path in files:
    if folder_of(path) == "selection" or path == SRC / "pg" / "compat.rs":
        continue
    for number, line in enumerate(without_comments(code(path)).splitlines(), 1):
        if PUBLICATION_CATALOGS.search(line):
            problems.append(f"src/{path.relative_to(SRC)}:{number} reads a publication's catalog: ask "
                            "selection/publication.rs")

# No function pointer crosses a layer: a lower layer that needs an upper one's work is handed
# none at run time (the upper layer calls down, or a worker entry is registered by its name).
FN_POINTER = re.compile(r"OnceLock<fn|: fn\(")
for path in files:
    if folder_of(path) == "pg":
        continue
    for number, line in enumerate(without_comments(path.read_text()).splitlines(), 1):
        if FN_POINTER.search(line):
            problems.append(f"src/{path.relative_to(SRC)}:{number} passes a function pointer: call down, or register "
                            "a worker entry by name")

# lib.rs's map names every module.
lib = (SRC / "lib.rs").read_text()
for path in files:
    if path.name != "mod.rs" and f"`{path.name}`" not in lib:
        problems.append(f"src/lib.rs's map does not name src/{path.relative_to(SRC)}")

for path in files:
    if (lines := len(path.read_text().splitlines())) > LINE_HINT:
        notes.append(f"note: src/{path.relative_to(SRC)} has {lines} lines: is it one concern?")

print("\n".join(notes))
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
order = " < ".join("{" + ", ".join(f) + "}" if len(f) > 1 else f[0] for f in LAYERS)
print(f"structure: {len(files)} source files in {len(RANK)} folders, layers {order}, no import upward or in a circle, "
      f"every impl with its type, lib.rs names every module, the installed schema asked in catalog/schema.rs only, "
      f"api/ without SPI and its functions at most {API_FUNCTION_LINES} lines, a publication read in selection/ only, "
      f"no function pointer across layers")
