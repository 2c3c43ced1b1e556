"""Where trips come from: the official TLC files (downloaded once, cached, verified), the offline generator,
or files you name. Each source yields `SourceFile`s: a local file, its period and its content checksum.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from ducklake_kit.errors import KitError

TLC_BASE_URL = "https://d37ci6vzurychx.cloudfront.net"
SOURCES = ("auto", "tlc", "synthetic", "files")
DEFAULT_MONTHS = "2024-01..2024-03"
DEFAULT_ROWS_PER_MONTH = 100_000  # the same size `all` loads, so a plain `load` after it is a no-op


def tlc_base_url() -> str:
    return os.environ.get("DUCKLAKE_TLC_BASE_URL", TLC_BASE_URL).rstrip("/")


@dataclass(frozen=True)
class SourceFile:
    path: Path  # local file Spark reads
    kind: str  # tlc | synthetic | files
    year: int | None  # the period the file holds (pickups outside it are quarantined)
    month: int | None
    sha256: str
    rows: int | None  # from the Parquet footer; None for CSV

    @property
    def period(self) -> str:
        if self.year is None:
            return "any"
        return f"{self.year:04d}-{self.month:02d}" if self.month else f"{self.year:04d}"


def parse_months(spec: str) -> list[tuple[int, int]]:
    """'2024-01..2024-03' or '2024-01,2024-05' -> [(2024, 1), (2024, 2), (2024, 3)]."""
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{4})-(\d{2})(?:\.\.(\d{4})-(\d{2}))?", part)
        if not m:
            raise KitError(f"cannot read the months '{part}'", "write YYYY-MM, YYYY-MM..YYYY-MM, or a comma list")
        y1, m1 = int(m.group(1)), int(m.group(2))
        y2, m2 = (int(m.group(3)), int(m.group(4))) if m.group(3) else (y1, m1)
        for y, mo in ((y1, m1), (y2, m2)):
            if not 1 <= mo <= 12:
                raise KitError(f"no such month: {y}-{mo:02d}", "months run from 01 to 12")
        if (y2, m2) < (y1, m1):
            raise KitError(f"the range '{part}' ends before it starts", "write the earlier month first")
        y, mo = y1, m1
        while (y, mo) <= (y2, m2):
            out.append((y, mo))
            y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
    return sorted(set(out))


FIRST_MONTH = (2009, 1)  # the TLC's yellow taxi trip records start in January 2009


def _check_months(wanted: list[tuple[int, int]]) -> None:
    """Months the TLC has published, or could have: not before its records start, not after this month."""
    today = date.today()
    for year, month in wanted:
        if (year, month) < FIRST_MONTH:
            raise KitError(
                f"the TLC's yellow taxi records start in 2009-01, so {year}-{month:02d} has no trips",
                "pick months from 2009-01 on",
            )
        if (year, month) > (today.year, today.month):
            raise KitError(f"{year}-{month:02d} is in the future", f"pick months up to {today:%Y-%m}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parquet_rows(path: Path) -> int:
    """Rows from the footer; a truncated or corrupt file is one clear error."""
    import pyarrow.parquet as pq  # imported here: `up`, `sql` and `status` never need it

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for broken files
        raise KitError(
            f"{path} is not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})",
            "re-download or regenerate it; a truncated download is deleted and fetched again by --source tlc",
        ) from None


def period_from_name(name: str) -> tuple[int | None, int | None]:
    """yellow_tripdata_2025-01_head10000.parquet -> (2025, 1); ..._2022_random10000.csv -> (2022, None)."""
    m = re.search(r"(?<!\d)(\d{4})-(\d{2})(?!\d)", name)
    if m and 1 <= int(m.group(2)) <= 12:
        return int(m.group(1)), int(m.group(2))
    m = re.search(r"(?<![\d-])(20\d{2}|19\d{2})(?![\d-])", name)
    return (int(m.group(1)), None) if m else (None, None)


def columns_of(path: Path) -> list[str]:
    """Column names from the Parquet schema or the CSV header, without reading the data."""
    import pyarrow.parquet as pq  # imported here: `up`, `sql` and `status` never need it

    if path.suffix.lower() == ".parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    with open(path, newline="", encoding="utf-8-sig") as f:
        return next(csv.reader(f), [])


def describe_file(path: Path, kind: str) -> SourceFile:
    """Checked before anything is landed or loaded: a readable footer and a known schema."""
    from ducklake_kit.taxi import schema  # pyarrow: only when a file is checked (start-up of `up`, `sql`, `status`)

    year, month = period_from_name(path.name)
    rows = parquet_rows(path) if path.suffix.lower() == ".parquet" else None
    variant = schema.detect_variant(columns_of(path), source=path.name)  # one clear error for an unknown schema
    check_values(path, variant)
    return SourceFile(path.resolve(), kind, year, month, sha256_file(path), rows)


def check_values(path: Path, variant) -> None:
    """What would fail the Spark job, found before anything is landed: a column the load keeps as a number that
    holds something else. Text is fine when it is a number ("12.5", CSV's every value): Spark casts it, but with
    ANSI mode (Spark 4's default) one value that is not a number fails the whole job, so those values are looked
    for here, with DuckDB. A Parquet column of another kind (a boolean, a struct) where a number belongs is refused
    by its type."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ducklake_kit.lake.sql import quote_ident, quote_literal
    from ducklake_kit.taxi import schema
    from ducklake_kit.taxi.reference import CSV_DIALECT

    target = {c.name: c.duckdb_type for c in schema.CANONICAL_COLUMNS}
    numeric = [(src, target[canon]) for src, canon in variant.mapping if target.get(canon) in ("INTEGER", "DOUBLE")]
    checks: list[tuple[str, str, str]] = []  # (column, what it must be, the SQL that finds a value that is not)
    if path.suffix.lower() == ".parquet":
        arrow = pq.ParquetFile(path).schema_arrow
        for src, kind in numeric:
            t = arrow.field(src).type
            c = quote_ident(src)
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                checks.append((src, kind, _text_is_not(c, kind)))
            elif not (
                pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_null(t)
            ):
                raise KitError(
                    f"{path.name}: column {src} is {t}, but the load needs a number there, so nothing was "
                    "landed or loaded",
                    f"convert {src} to a number and load the file again",
                )
            elif kind == "INTEGER":  # a number that does not fit a 32-bit integer (or NaN) fails Spark's cast
                checks.append((src, kind, f"{c} IS NOT NULL AND TRY_CAST({c} AS INTEGER) IS NULL"))
        relation = f"read_parquet({quote_literal(str(path))})"
    else:
        checks = [(src, kind, _text_is_not(quote_ident(src), kind)) for src, kind in numeric]
        relation = f"read_csv({quote_literal(str(path))}, {CSV_DIALECT})"
    if not checks:
        return
    sql = (
        "SELECT "
        + ", ".join(
            f"count(*) FILTER (WHERE {bad}), any_value({quote_ident(c)}::VARCHAR) FILTER (WHERE {bad})"
            for c, _kind, bad in checks
        )
        + f" FROM {relation}"
    )
    with duckdb.connect() as con:
        try:
            row = con.execute(sql).fetchone()
        except duckdb.Error as exc:
            raise KitError(
                f"{path.name} cannot be read ({str(exc).splitlines()[0][:160]})",
                "check the file: a CSV needs a header row and commas between values",
            ) from None
    for i, (column, kind, _bad) in enumerate(checks):
        count, example = row[2 * i], row[2 * i + 1]
        if count:
            need = "a whole number that fits 32 bits" if kind == "INTEGER" else "a number"
            raise KitError(
                f"{path.name}: column {column} holds {count} value(s) that are not {need} (e.g. {example!r}), "
                "so nothing was landed or loaded",
                f"fix or blank those values of {column} and load the file again",
            )


def _text_is_not(column: str, kind: str) -> str:
    """SQL true for a text value Spark's ANSI cast would fail on (integers go through DOUBLE, as `conform` does)."""
    as_double = f"TRY_CAST(trim({column}) AS DOUBLE)"
    number = f"TRY_CAST({as_double} AS INTEGER)" if kind == "INTEGER" else as_double
    return f"{column} IS NOT NULL AND {number} IS NULL"


# -- synthetic --------------------------------------------------------------------------------------------


def synthetic_files(cache: Path, months: list[tuple[int, int]], rows_per_month: int, seed: int = 0) -> list[SourceFile]:
    """Generate each month once per (seed, size); deterministic, so a cached file is the same file."""
    from ducklake_kit.taxi import synthetic  # pyarrow: only when files are generated

    folder = cache / "synthetic" / f"seed{seed}-rows{rows_per_month}"
    out = []
    for year, month in months:
        path = folder / synthetic.month_file_name(year, month)
        if not path.exists():
            synthetic.generate_month(path, year, month, rows_per_month, seed=seed)
        out.append(describe_file(path, "synthetic"))
    return out


def zone_lookup(cache: Path, near: list[Path] | None = None) -> tuple[Path, str]:
    """The zone lookup: a real taxi_zone_lookup.csv next to the given files or downloaded before, else synthetic."""
    from ducklake_kit.taxi import synthetic  # pyarrow: only when files are generated

    for folder in {p.parent for p in near or []}:
        candidate = folder / "taxi_zone_lookup.csv"
        if candidate.exists():
            return candidate, "real (next to the files)"
    cached = cache / "tlc" / "taxi_zone_lookup.csv"
    if cached.exists():
        return cached, "real (TLC download)"
    path = cache / "synthetic" / "taxi_zone_lookup.csv"
    if not path.exists():
        synthetic.write_zone_lookup(path)
    return path, "synthetic (offline)"


# -- files ------------------------------------------------------------------------------------------------


def user_files(patterns: list[str]) -> list[SourceFile]:
    paths: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise KitError(
                f"no file matches '{pattern}'", "check the path or glob (quote it so the shell does not expand it)"
            )
        for m in matches:
            p = Path(m)
            if p.name != "taxi_zone_lookup.csv" and p.resolve() not in seen:  # a file named twice loads once
                seen.add(p.resolve())
                paths.append(p)
    if not paths:
        raise KitError(
            f"no trips file matches {', '.join(repr(p) for p in patterns)} (only the zone lookup)",
            "give the trips files; a taxi_zone_lookup.csv next to them is used for the zones",
        )
    bad = [p for p in paths if p.suffix.lower() not in (".parquet", ".csv")]
    if bad:
        raise KitError(f"{bad[0]} is neither Parquet nor CSV", "give .parquet or .csv files of TLC yellow trips")
    return [describe_file(p, "files") for p in paths]


# -- TLC download -----------------------------------------------------------------------------------------


def tlc_url(year: int, month: int) -> str:
    from ducklake_kit.taxi import synthetic  # pyarrow: only when files are generated

    return f"{tlc_base_url()}/trip-data/{synthetic.month_file_name(year, month)}"


def tlc_reachable(timeout: float = 3.0) -> tuple[bool, str]:
    """Can we reach the TLC download host? (a HEAD of a known file, no download)."""
    try:
        req = urllib.request.Request(tlc_url(2024, 1), method="HEAD")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status == 200, f"{tlc_base_url()} answered {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{tlc_base_url()} answered {exc.code}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{tlc_base_url()} is unreachable ({reason})"


def download(url: str, dest: Path, *, label: str, timeout: float = 30.0) -> Path:
    """Download to `dest` once: resume a partial `.part` file with a Range request, then rename."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the .part is already complete
            part.rename(dest)
            return dest
        if exc.code in (403, 404):
            raise KitError(
                f"TLC has no file at {url} (HTTP {exc.code})",
                "pick months TLC has published (from 2009-01, about two months behind)",
            ) from None
        raise KitError(
            f"downloading {url} failed (HTTP {exc.code})", "try again later, or use --source synthetic"
        ) from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise KitError(
            f"cannot reach {url} ({getattr(exc, 'reason', exc)})", "check the network, or use --source synthetic"
        ) from None
    with resp:
        resumed = resp.status == 206
        length = int(resp.headers.get("Content-Length") or 0)
        done = have if resumed else 0
        total = length + done
        try:
            with (
                open(part, "ab" if resumed else "wb") as out,
                Progress(
                    TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
                ) as progress,
            ):
                task = progress.add_task(label, total=total or None, completed=done)
                # read1: what arrived is written before a stall or a reset, so a re-run resumes from it
                for block in iter(lambda: resp.read1(1 << 20), b""):
                    out.write(block)
                    done += len(block)
                    progress.advance(task, len(block))
        except (OSError, http.client.HTTPException) as exc:  # reset, timeout, broken chunked encoding
            raise _broke_off(url, done, total, f"{type(exc).__name__}: {exc}") from None
        if length and done < total:  # http.client returns short reads silently when the server closes early
            raise _broke_off(url, done, total, "the server closed the connection early")
    part.rename(dest)
    return dest


def _broke_off(url: str, done: int, total: int, why: str) -> KitError:
    """A transfer that stopped mid-way: the `.part` keeps the bytes that arrived; the next run resumes."""
    of = f" of {total:,}" if total else ""
    return KitError(
        f"the download of {url} broke off after {done:,}{of} bytes ({why})",
        "run it again: it resumes from the bytes kept, or use --source synthetic",
    )


def tlc_files(cache: Path, months: list[tuple[int, int]]) -> list[SourceFile]:
    from ducklake_kit.taxi import synthetic  # pyarrow: only when files are generated

    out = []
    for year, month in months:
        dest = cache / "tlc" / synthetic.month_file_name(year, month)
        download(tlc_url(year, month), dest, label=dest.name)
        try:
            parquet_rows(dest)  # verified: a footer that reads
        except KitError:
            dest.unlink()  # never keep a broken download: the next run fetches it again
            raise
        out.append(describe_file(dest, "tlc"))
    download(
        f"{tlc_base_url()}/misc/taxi_zone_lookup.csv",
        cache / "tlc" / "taxi_zone_lookup.csv",
        label="taxi_zone_lookup.csv",
    )
    return out


def resolve(
    source: str, cache: Path, *, months: str, paths: list[str], rows_per_month: int, seed: int = 0
) -> tuple[list[SourceFile], str]:
    """The files to load and one sentence saying which source was used and why."""
    if source not in SOURCES:
        raise KitError(f"unknown source '{source}'", f"choose one of: {', '.join(SOURCES)}")
    if source == "files":
        if not paths:
            raise KitError("--source files needs --path", "e.g. --path '../shared/tlc-samples/*2025*.parquet'")
        return user_files(paths), f"files: {len(paths)} pattern(s)"
    wanted = parse_months(months)
    _check_months(wanted)
    if source in ("auto", "synthetic") and rows_per_month < 1:
        raise KitError(
            f"--rows-per-month must be at least 1 (got {rows_per_month})",
            "give the number of trips a synthetic month holds, e.g. --rows-per-month 100000",
        )
    if source == "auto":
        ok, why = tlc_reachable()
        source = "tlc" if ok else "synthetic"
        note = f"auto chose {source}: {why}"
    else:
        note = source
    if source == "tlc":
        return tlc_files(cache, wanted), note
    return synthetic_files(
        cache, wanted, rows_per_month, seed
    ), note + f" ({rows_per_month:,} rows a month, seed {seed})"
