"""The extensions' signatures are checked once per file version, not at every connection: a file that passed DuckDB's
own check is remembered by its device, inode, size, mtime and ctime; a file that changed after it passed, or never
passed, is checked again and refused by DuckDB. A connection opened without the check loads the kit's own files and
then has it back on for good: another unsigned file a statement LOADs is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from ducklake_kit.lake import connection
from ducklake_kit.lake.connection import connect_config, extension_path, extensions_verified, load_statements


@pytest.fixture(autouse=True)
def nothing_verified_yet(monkeypatch):
    """This process's memory of checked files starts empty (a Lake opened by an earlier test fills it)."""
    monkeypatch.setattr(connection, "_verified_now", set())


@pytest.fixture
def httpfs_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the httpfs wheel's file, which the kit then takes for httpfs's (the others stay the wheels')."""
    genuine = extension_path("httpfs")
    assert genuine is not None
    copy = tmp_path / "httpfs.duckdb_extension"
    shutil.copyfile(genuine, copy)
    real = connection.extension_path
    monkeypatch.setattr(connection, "extension_path", lambda name: copy if name == "httpfs" else real(name))
    return copy


def _flip_a_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def test_the_wheels_files_pass_once_and_the_record_names_each(tmp_path):
    record = tmp_path / "verified.json"
    assert extensions_verified(record_file=record)
    files = json.loads(record.read_text())["files"]
    assert sorted(files) == sorted(str(extension_path(n)) for n in connection.EXTENSIONS)
    assert connect_config()["allow_unsigned_extensions"] is True
    # another process trusts the record without loading anything: DuckDB cannot even connect there
    probe = (
        "import duckdb, sys\n"
        "def refused(*a, **k): raise SystemExit('connected: the record was not trusted')\n"
        "duckdb.connect = refused\n"
        "from pathlib import Path\n"
        "from ducklake_kit.lake.connection import extensions_verified\n"
        f"print(extensions_verified(record_file=Path({str(record)!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_a_file_changed_after_it_passed_is_checked_again_and_refused(tmp_path, httpfs_copy):
    record = tmp_path / "verified.json"
    assert extensions_verified(("httpfs",), record_file=record)  # the copy is the genuine file, signed
    _flip_a_byte(httpfs_copy)  # then it is written: its mtime, ctime (and content) change
    assert not extensions_verified(("httpfs",), record_file=record)
    config = connect_config(("httpfs",))
    assert "allow_unsigned_extensions" not in config
    con = duckdb.connect(config=config)
    with pytest.raises(duckdb.Error, match="signature"):
        con.execute(f"LOAD '{httpfs_copy}'")
    con.close()


def test_a_file_that_never_passed_is_not_recorded(tmp_path, httpfs_copy):
    _flip_a_byte(httpfs_copy)
    record = tmp_path / "verified.json"
    assert not extensions_verified(("httpfs",), record_file=record)
    assert not record.exists()


def test_after_the_kits_loads_a_statement_cannot_load_an_unsigned_file(tmp_path):
    """A connection opened as the kit opens one (no second check of the verified files) and loaded: an httpfs copy
    with a broken signature (its last byte: the code is intact, so without the check it would load) is refused by
    DuckDB's check, and the check cannot be turned off again."""
    names = ("ducklake", "postgres_scanner")  # httpfs not loaded, so the copy is a new extension to this database
    config = connect_config(names)
    assert config["allow_unsigned_extensions"] is True
    unsigned = tmp_path / "httpfs.duckdb_extension"
    shutil.copyfile(extension_path("httpfs"), unsigned)
    with unsigned.open("r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 0xFF]))
    con = duckdb.connect(config=config)
    try:
        for stmt in load_statements(names):
            con.execute(stmt)
        assert {
            r[0] for r in con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()
        } >= {
            "ducklake",
            "postgres_scanner",
        }
        with pytest.raises(duckdb.Error, match="signature"):
            con.execute(f"LOAD '{unsigned}'")
        with pytest.raises(duckdb.Error, match="allow_unsigned_extensions"):
            con.execute("SET allow_unsigned_extensions = true")
    finally:
        con.close()
