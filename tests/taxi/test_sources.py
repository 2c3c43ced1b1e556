"""The sources of a load: the TLC download (against a real HTTP server on loopback, pointed at with
DUCKLAKE_TLC_BASE_URL), `auto`'s choice, month and period parsing, user files, and real CSV samples
loaded end to end through Spark with their out-of-period rows quarantined."""

from __future__ import annotations

import csv
import hashlib
import http.server
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.procs import free_port
from ducklake_kit.taxi import sources, synthetic

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "tlc-samples"
GX_2019_08 = SAMPLES / "gx_yellow_tripdata_samples_2018-2020" / "yellow_tripdata_sample_2019-08.csv"
BIGQUERY_2022 = SAMPLES / "bigquery_tlc_yellow_trips_2022_random10000.csv"
MONTH = (2024, 1)  # the month `tlc_reachable` asks the host about
MONTH_NAME = synthetic.month_file_name(*MONTH)
MONTH_ROWS = 3000


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- a real HTTP server with Range support ---------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class TlcServer:
    """Serves `root` on 127.0.0.1 like the TLC host: /trip-data/<month file>, /misc/taxi_zone_lookup.csv."""

    root: Path
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    ranges: bool = True  # False: ignore Range and always answer 200 with the whole file
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the connection drops
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the server goes quiet

    def gets(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path == path]


def _handler(server: TlcServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: pytest shows failures, not access logs
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            rng = self.headers.get("Range")
            file = server.root / self.path.lstrip("/")
            if ".." in self.path or not file.is_file():
                return self._answer(404, b"not found", body, rng)
            data = file.read_bytes()
            start = 0
            if rng and server.ranges:
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    return self._answer(416, b"", body, rng, {"Content-Range": f"bytes */{len(data)}"})
            chunk = data[start:]
            headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
            self._answer(206 if start else 200, chunk, body, rng, headers, promised=len(chunk))

        def _answer(self, status, data, body, rng, headers=None, promised=None) -> None:
            sent = data if body else b""
            cut = server.cut_after.get(self.path)
            stall = server.stall_after.get(self.path)
            if body and cut is not None:
                sent = data[:cut]
            if body and stall is not None:
                sent = data[:stall]
            server.seen.append(Seen(self.command, self.path, rng, status, len(sent)))
            self.send_response(status)
            self.send_header("Content-Length", str(promised if promised is not None else len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(sent)
            self.wfile.flush()
            if body and stall is not None:
                time.sleep(1.5)  # longer than the client's timeout in the test that sets it

    return Handler


@pytest.fixture(scope="module")
def month_file(tmp_path_factory) -> Path:
    return synthetic.generate_month(tmp_path_factory.mktemp("month") / MONTH_NAME, *MONTH, MONTH_ROWS, seed=3).path


@pytest.fixture
def tlc(tmp_path, month_file, monkeypatch) -> Iterator[TlcServer]:
    """A TLC-like host on a free loopback port holding one month and the zone lookup; the kit points at it."""
    root = tmp_path / "served"
    (root / "trip-data").mkdir(parents=True)
    shutil.copy(month_file, root / "trip-data" / MONTH_NAME)
    synthetic.write_zone_lookup(root / "misc" / "taxi_zone_lookup.csv")
    server = TlcServer(root)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("DUCKLAKE_TLC_BASE_URL", server.url)
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def dead_host(monkeypatch) -> str:
    """A loopback port nobody listens on."""
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("DUCKLAKE_TLC_BASE_URL", url)
    return url


MONTH_PATH = f"/trip-data/{MONTH_NAME}"
ZONES_PATH = "/misc/taxi_zone_lookup.csv"


def leftovers(cache: Path) -> list[str]:
    folder = cache / "tlc"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# -- --source tlc ------------------------------------------------------------------------------------------


def test_tlc_downloads_once_verified_and_never_again(tlc, tmp_path):
    cache = tmp_path / "cache"
    served = (tlc.root / "trip-data" / MONTH_NAME).read_bytes()
    (f,) = sources.tlc_files(cache, [MONTH])
    assert (f.kind, f.period, f.rows, f.sha256) == ("tlc", "2024-01", MONTH_ROWS, sha256(served))
    assert sha256(f.path.read_bytes()) == sha256(served)
    assert (cache / "tlc" / "taxi_zone_lookup.csv").read_bytes() == (
        tlc.root / "misc" / "taxi_zone_lookup.csv"
    ).read_bytes()
    assert [(s.path, s.range, s.status) for s in tlc.seen] == [(MONTH_PATH, None, 200), (ZONES_PATH, None, 200)]
    assert leftovers(cache) == ["taxi_zone_lookup.csv", MONTH_NAME]  # no .part left behind

    (again,) = sources.tlc_files(cache, [MONTH])
    assert again == f
    assert len(tlc.seen) == 2, tlc.seen  # cached: not one more request
    assert sources.zone_lookup(cache) == (cache / "tlc" / "taxi_zone_lookup.csv", "real (TLC download)")


def test_tlc_resumes_a_partial_download_with_a_range_request(tlc, tmp_path):
    cache = tmp_path / "cache"
    served = (tlc.root / "trip-data" / MONTH_NAME).read_bytes()
    have = len(served) // 3
    (cache / "tlc").mkdir(parents=True)
    (cache / "tlc" / f"{MONTH_NAME}.part").write_bytes(served[:have])
    (f,) = sources.tlc_files(cache, [MONTH])
    (get,) = tlc.gets(MONTH_PATH)
    assert (get.range, get.status, get.body_bytes) == (f"bytes={have}-", 206, len(served) - have)  # only the rest
    assert f.sha256 == sha256(served) and f.rows == MONTH_ROWS
    assert f"{MONTH_NAME}.part" not in leftovers(cache)


def test_tlc_restarts_when_the_server_ignores_range(tlc, tmp_path):
    # a host without Range support answers 200 with the whole file: it must replace the .part, not append to it
    tlc.ranges = False
    cache = tmp_path / "cache"
    served = (tlc.root / "trip-data" / MONTH_NAME).read_bytes()
    (cache / "tlc").mkdir(parents=True)
    (cache / "tlc" / f"{MONTH_NAME}.part").write_bytes(b"x" * 1000)
    (f,) = sources.tlc_files(cache, [MONTH])
    (get,) = tlc.gets(MONTH_PATH)
    assert (get.range, get.status) == ("bytes=1000-", 200)
    assert f.sha256 == sha256(served)


def test_tlc_finishes_a_part_that_is_already_complete(tlc, tmp_path):
    cache = tmp_path / "cache"
    served = (tlc.root / "trip-data" / MONTH_NAME).read_bytes()
    (cache / "tlc").mkdir(parents=True)
    (cache / "tlc" / f"{MONTH_NAME}.part").write_bytes(served)
    (f,) = sources.tlc_files(cache, [MONTH])
    (get,) = tlc.gets(MONTH_PATH)
    assert (get.range, get.status, get.body_bytes) == (f"bytes={len(served)}-", 416, 0)
    assert f.sha256 == sha256(served)


def test_tlc_month_the_host_lacks_is_one_clear_error(tlc, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(KitError) as err:
        sources.tlc_files(cache, [(2009, 1)])
    assert err.value.what == f"TLC has no file at {tlc.url}/trip-data/yellow_tripdata_2009-01.parquet (HTTP 404)"
    assert "pick months TLC has published" in err.value.fix
    assert leftovers(cache) == []


def test_tlc_broken_parquet_is_deleted_and_fetched_again_next_time(tlc, tmp_path):
    cache = tmp_path / "cache"
    served = tlc.root / "trip-data" / MONTH_NAME
    good = served.read_bytes()
    served.write_bytes(good[: len(good) // 2])  # the host itself holds a truncated file: HTTP is complete
    with pytest.raises(KitError, match="is not a readable Parquet file"):
        sources.tlc_files(cache, [MONTH])
    assert leftovers(cache) == []  # neither the file nor a .part is kept
    served.write_bytes(good)
    (f,) = sources.tlc_files(cache, [MONTH])
    assert len(tlc.gets(MONTH_PATH)) == 2 and f.sha256 == sha256(good)


@pytest.mark.parametrize("how", ["cut", "stall"])
def test_tlc_interrupted_transfer_keeps_the_part_and_resumes(tlc, tmp_path, how):
    # the connection drops (or goes quiet) mid-body: a clear error, the bytes kept, the next run resumes
    cache = tmp_path / "cache"
    served = (tlc.root / "trip-data" / MONTH_NAME).read_bytes()
    got = len(served) // 2
    (tlc.cut_after if how == "cut" else tlc.stall_after)[MONTH_PATH] = got
    dest = cache / "tlc" / MONTH_NAME
    with pytest.raises(KitError) as err:
        sources.download(f"{tlc.url}{MONTH_PATH}", dest, label=MONTH_NAME, timeout=0.5)
    assert err.value.what.startswith(
        f"the download of {tlc.url}{MONTH_PATH} broke off after {got:,} of {len(served):,} bytes"
    )
    assert "run it again: it resumes" in err.value.fix
    assert (
        leftovers(cache) == [f"{MONTH_NAME}.part"]
        and (cache / "tlc" / f"{MONTH_NAME}.part").read_bytes() == served[:got]
    )
    tlc.cut_after.clear(), tlc.stall_after.clear()
    (f,) = sources.tlc_files(cache, [MONTH])
    assert tlc.gets(MONTH_PATH)[-1].range == f"bytes={got}-" and f.sha256 == sha256(served)


def test_tlc_truncated_zone_lookup_is_not_cached(tlc, tmp_path):
    # the lookup has no footer to verify: a short transfer must not become the cached lookup for good
    cache = tmp_path / "cache"
    tlc.cut_after[ZONES_PATH] = 500
    with pytest.raises(KitError, match="broke off after 500 of"):
        sources.tlc_files(cache, [MONTH])
    assert not (cache / "tlc" / "taxi_zone_lookup.csv").exists()
    assert sources.zone_lookup(cache)[1] == "synthetic (offline)"


def test_tlc_unreachable_host_is_one_clear_error(dead_host, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(KitError) as err:
        sources.tlc_files(cache, [MONTH])
    assert err.value.what.startswith(f"cannot reach {dead_host}/trip-data/{MONTH_NAME} (")
    assert "use --source synthetic" in err.value.fix
    assert leftovers(cache) == []


# -- --source auto -----------------------------------------------------------------------------------------


def test_auto_chooses_tlc_when_the_host_answers(tlc, tmp_path):
    files, note = sources.resolve("auto", tmp_path / "cache", months="2024-01", paths=[], rows_per_month=100)
    assert note == f"auto chose tlc: {tlc.url} answered 200"
    assert [(f.kind, f.period, f.rows) for f in files] == [("tlc", "2024-01", MONTH_ROWS)]
    assert next((s.method, s.path) for s in tlc.seen) == ("HEAD", MONTH_PATH)  # the probe downloads nothing
    assert tlc.seen[0].body_bytes == 0


def test_auto_falls_back_to_synthetic_when_unreachable(dead_host, tmp_path):
    files, note = sources.resolve("auto", tmp_path / "cache", months="2024-01", paths=[], rows_per_month=100)
    assert note.startswith(f"auto chose synthetic: {dead_host} is unreachable (")
    assert note.endswith("(100 rows a month, seed 0)")
    assert [(f.kind, f.period, f.rows) for f in files] == [("synthetic", "2024-01", 100)]


def test_auto_falls_back_to_synthetic_when_the_host_lacks_the_probe_file(tlc, tmp_path):
    (tlc.root / "trip-data" / MONTH_NAME).unlink()
    files, note = sources.resolve("auto", tmp_path / "cache", months="2024-01", paths=[], rows_per_month=100)
    assert note.startswith(f"auto chose synthetic: {tlc.url} answered 404")
    assert files[0].kind == "synthetic"


# -- months, periods, user files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, months",
    [
        ("2024-01..2024-03", [(2024, 1), (2024, 2), (2024, 3)]),
        ("2024-11..2025-02", [(2024, 11), (2024, 12), (2025, 1), (2025, 2)]),  # across a year end
        ("2024-05, 2024-01,2024-05", [(2024, 1), (2024, 5)]),  # sorted, each once
        ("2024-02..2024-02", [(2024, 2)]),
        ("2023-12..2024-01,2024-01..2024-02", [(2023, 12), (2024, 1), (2024, 2)]),
    ],
)
def test_parse_months(spec, months):
    assert sources.parse_months(spec) == months


@pytest.mark.parametrize(
    "spec, what",
    [
        ("2024-13", "no such month: 2024-13"),
        ("2024-00..2024-02", "no such month: 2024-00"),
        ("2024-03..2024-01", "the range '2024-03..2024-01' ends before it starts"),
        ("March", "cannot read the months 'March'"),
        ("2024-1", "cannot read the months '2024-1'"),
        ("2024-01,", "cannot read the months ''"),
        ("2024-01...2024-02", "cannot read the months '2024-01...2024-02'"),
    ],
)
def test_parse_months_errors(spec, what):
    with pytest.raises(KitError) as err:
        sources.parse_months(spec)
    assert err.value.what == what


@pytest.mark.parametrize(
    "name, period",
    [
        ("yellow_tripdata_sample_2019-01.csv", (2019, 1)),
        ("yellow_tripdata_sample_2020-12.csv", (2020, 12)),
        ("bigquery_tlc_yellow_trips_2022_random10000.csv", (2022, None)),
        ("yellow_tripdata_2025-01_head10000.parquet", (2025, 1)),
        ("yellow_tripdata_2025-02_random5000.parquet", (2025, 2)),
        ("yellow_tripdata_2024-03.parquet", (2024, 3)),
        ("taxi_zone_lookup.csv", (None, None)),
        ("yellow_tripdata_2024-13.parquet", (None, None)),  # not a month, and not a bare year either
        ("trips_random10000.csv", (None, None)),  # 10000 is not a year
    ],
)
def test_period_from_name(name, period):
    assert sources.period_from_name(name) == period


@pytest.mark.skipif(not SAMPLES.exists(), reason=f"the real TLC samples ({SAMPLES}) are not here")
def test_every_real_sample_gets_its_period_from_its_name():
    trips = [p for p in SAMPLES.rglob("*") if p.suffix in (".csv", ".parquet") and p.name != "taxi_zone_lookup.csv"]
    assert len(trips) >= 39  # the documented samples; guards against a vacuous pass
    periods = {p.name: sources.period_from_name(p.name) for p in trips}
    assert all(y is not None for y, _ in periods.values()), periods
    assert sum(1 for _, m in periods.values() if m is None) == 1  # only the BigQuery export spans a year


def test_user_files_no_match_is_one_clear_error(tmp_path):
    pattern = str(tmp_path / "*.parquet")
    with pytest.raises(KitError) as err:
        sources.user_files([pattern])
    assert err.value.what == f"no file matches '{pattern}'"


def test_user_files_refuses_what_is_neither_parquet_nor_csv(tmp_path):
    (tmp_path / "yellow_tripdata_2024-01.json").write_text("{}")
    with pytest.raises(KitError) as err:
        sources.user_files([str(tmp_path / "yellow_tripdata_2024-01.*")])
    assert err.value.what == f"{tmp_path / 'yellow_tripdata_2024-01.json'} is neither Parquet nor CSV"


def test_user_files_with_only_a_zone_lookup_is_an_error_not_an_empty_load(tmp_path):
    synthetic.write_zone_lookup(tmp_path / "taxi_zone_lookup.csv")
    pattern = str(tmp_path / "*.csv")
    with pytest.raises(KitError) as err:
        sources.user_files([pattern])
    assert err.value.what == f"no trips file matches '{pattern}' (only the zone lookup)"


def test_user_files_named_twice_are_loaded_once(month_file):
    # `--path a.parquet --path '*.parquet'`: the same file twice would load its rows twice
    files = sources.user_files([str(month_file), str(month_file.parent / "*.parquet")])
    assert [(f.path, f.kind, f.period, f.rows) for f in files] == [
        (month_file.resolve(), "files", "2024-01", MONTH_ROWS)
    ]


@pytest.mark.skipif(not SAMPLES.exists(), reason=f"the real TLC samples ({SAMPLES}) are not here")
def test_user_files_describe_real_samples():
    files = sources.user_files([str(SAMPLES / "*2025*.parquet"), str(BIGQUERY_2022)])
    assert [(f.path.name, f.period, f.rows) for f in files] == [
        ("yellow_tripdata_2025-01_head10000.parquet", "2025-01", 10000),
        ("yellow_tripdata_2025-02_random5000.parquet", "2025-02", 5000),
        (BIGQUERY_2022.name, "2022", None),  # CSV: no footer to count from
    ]
    assert all(f.sha256 == sha256(f.path.read_bytes()) for f in files)


# -- real CSV samples through the whole load ---------------------------------------------------------------


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def _wall_clock(text: str) -> datetime:
    # BigQuery labels local wall-clock times '+00:00': the label is not a time zone, drop it
    return datetime.fromisoformat(text.removesuffix("+00:00"))


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.skipif(not SAMPLES.exists(), reason=f"the real TLC samples ({SAMPLES}) are not here")
def test_real_csv_samples_load_checked_with_out_of_period_rows_quarantined(stack):
    from ducklake_kit.taxi import flow

    # append: another test of the shared lake (test_queries) may have loaded the BigQuery sample already
    result, checks = flow.load_checked(
        Kit.on(stack.platform, stack.state),
        flow.LoadSpec(source="files", mode="append", paths=[str(GX_2019_08), str(BIGQUERY_2022)]),
    )
    assert checks.ok, [c.as_dict() for c in checks.failed]
    by_name = {fr.source.path.name: fr for fr in result.files}
    assert sorted(by_name) == sorted([GX_2019_08.name, BIGQUERY_2022.name])
    with Lake(stack.platform.endpoints()) as lake:
        for path, period, in_period in [
            (GX_2019_08, "2019-08", lambda t: (t.year, t.month) == (2019, 8)),
            (BIGQUERY_2022, "2022", lambda t: t.year == 2022),
        ]:
            fr = by_name[path.name]
            rows = _csv_rows(path)
            assert (fr.status, fr.source.period, fr.rows_read, fr.rows_accepted + fr.rows_rejected) == (
                "loaded",
                period,
                len(rows),
                len(rows),
            )
            # expected from the CSV itself: rows with both timestamps whose pickup lies outside the period
            expected = sorted(
                _wall_clock(r["pickup_datetime"])
                for r in rows
                if r["pickup_datetime"] and r["dropoff_datetime"] and not in_period(_wall_clock(r["pickup_datetime"]))
            )
            assert expected, f"{path.name} should hold a stray pickup"  # 2008-12-31 and 2002-10-24
            got = [
                r[0]
                for r in lake.con.execute(
                    "SELECT pickup_at FROM quarantine WHERE source_file = ? AND load_id = ? "
                    "AND reject_reason = 'pickup_outside_period' ORDER BY pickup_at",
                    [path.name, result.load_id],
                ).fetchall()
            ]
            assert got == expected
            assert (
                lake.scalar(
                    "SELECT count(*) FROM trips WHERE source_file = ? AND pickup_year <> ?",
                    [path.name, int(period[:4])],
                )
                == 0
            )
