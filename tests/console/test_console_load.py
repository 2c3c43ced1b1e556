"""The Load page in a real browser: a file of trips (the offline generator's, tiny) loaded through the kit's own
PySpark `load`, its progress seen while it runs, a second load refused while it runs, the page left and found again,
then the page's snapshot and rows compared with the catalog's and the lake's; a bad path is one line and no snapshot.
A lake of its own (module_stack: the load writes main.trips, which the session's other tests read), one console,
one Spark start."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.platforms import console as console_mod
from tests.console.consoles import console_of

ROWS = 300


@pytest.fixture(scope="module")
def web(module_stack):
    """The console of this module's own lake (one worker)."""
    with console_of(module_stack, 1) as result:
        yield result


@pytest.fixture(scope="module")
def trips_file():
    """A month of synthetic trips in a folder the console's user (the service user, as root) can read."""
    from ducklake_kit.taxi import synthetic

    folder = Path(tempfile.mkdtemp(prefix="ducklake-console-load-"))
    try:
        folder.chmod(0o755)
        path = folder / synthetic.month_file_name(2024, 2)
        synthetic.generate_month(path, 2024, 2, ROWS, seed=26)
        path.chmod(0o644)
        (folder / "notes.txt").write_text("not trips\n")
        (folder / "empty").mkdir(mode=0o755)
        (folder / "private").mkdir(mode=0o755)
        shutil.copy(path, folder / "private" / path.name)
        (folder / "private" / path.name).chmod(0o600)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _snapshots(lake: Lake) -> list[tuple[int, str | None]]:
    return [
        (int(r[0]), r[1])
        for r in lake.con.execute(
            f"SELECT snapshot_id, commit_message FROM ducklake_snapshots('{lake.alias}') ORDER BY snapshot_id"
        ).fetchall()
    ]


def _open(page, web) -> None:
    page.goto(f"{web['url']}load")
    page.wait_for_selector("[data-testid=load-run]")


def test_a_bad_path_is_one_line_and_no_snapshot(page, web, module_stack, trips_file):
    from playwright.sync_api import expect

    with Lake(module_stack.platform.endpoints()) as lake:
        before = _snapshots(lake)
    _open(page, web)
    cases = [
        ("/no/such/folder", "no file or folder at /no/such/folder"),
        ("relative/trips.parquet", "is not an absolute path"),
        (str(trips_file.parent / "notes.txt"), "notes.txt is neither a .csv nor a .parquet file"),
        (str(trips_file.parent / "empty"), "holds no .csv or .parquet file"),
    ]
    if web["user"] != pwd.getpwuid(os.geteuid()).pw_name:  # the console runs as the service user: a 0600 file of ours
        cases.append((str(trips_file.parent / "private" / trips_file.name), "cannot read"))
    for bad, says in cases:
        page.locator("[data-testid=load-path]").fill(bad)
        page.locator("[data-testid=load-run]").click()
        refused = page.locator("[data-testid=load-refused]")
        expect(refused).to_contain_text(says)  # this case's line, not the one before it
        line = refused.inner_text()
        assert line.startswith("Error: ") and says in line and ". Try: " in line and "\n" not in line, line
        page.wait_for_selector("[data-testid=load-run]:not([disabled])")
    assert page.locator("[data-testid=load-state]").count() == 0  # no load started
    with Lake(module_stack.platform.endpoints()) as lake:
        assert _snapshots(lake) == before


def test_a_file_loads_with_progress_and_the_catalog_agrees(page, web, module_stack, trips_file):
    import pyarrow.parquet as pq

    with Lake(module_stack.platform.endpoints()) as lake:
        before = _snapshots(lake)
    _open(page, web)
    # the folder: its one trips file is loaded, its notes.txt and its subfolders are not
    page.locator("[data-testid=load-path]").fill(str(trips_file.parent))
    page.locator("[data-testid=load-run]").click()
    page.wait_for_selector("[data-testid=load-running]")
    # one at a time: a second load while this one runs is refused in one line
    page.locator("[data-testid=load-run]").click()
    busy = page.locator("[data-testid=load-refused]")
    busy.wait_for()
    assert "a load is running already" in busy.inner_text()
    # leave the page and come back: the same load, still shown
    page.goto(web["url"])
    page.wait_for_selector("[data-testid=run]")
    _open(page, web)
    page.wait_for_selector("[data-testid=load-state]")
    seen_running: list[str] = []  # the progress text read while the load ran
    deadline = time.monotonic() + 600
    while (
        time.monotonic() < deadline
        and page.locator("[data-testid=load-summary], [data-testid=load-error]").count() == 0
    ):
        progress = page.locator("[data-testid=load-progress]")
        if page.locator("[data-testid=load-running]").count() and progress.count():
            text = progress.inner_text()
            if not seen_running or seen_running[-1] != text:
                seen_running.append(text)
        page.wait_for_timeout(250)
    assert page.locator("[data-testid=load-error]").count() == 0, page.locator("[data-testid=load-error]").inner_text()
    summary = page.locator("[data-testid=load-summary]").inner_text()
    # progress came while it ran (the load's own reporter lines, in their order), not only at the end
    assert any("Spark" in t for t in seen_running), seen_running
    final = page.locator("[data-testid=load-progress]").inner_text()
    steps = ["source: files", "landing raw files", "Spark: conform", "registering"]
    at = [next(i for i, line in enumerate(final.splitlines()) if line.startswith(s)) for s in steps]
    assert at == sorted(at), final
    # the page's figures against the catalog's and the lake's
    load_id = summary.split(":")[0].removeprefix("load ")
    file_rows = pq.ParquetFile(trips_file).metadata.num_rows
    assert file_rows == ROWS
    with Lake(module_stack.platform.endpoints()) as lake:
        after = _snapshots(lake)
        trips = lake.scalar("SELECT count(*) FROM main.trips WHERE load_id = ?", [load_id])
        quarantined = lake.scalar("SELECT count(*) FROM main.quarantine WHERE load_id = ?", [load_id])
        total = lake.scalar("SELECT count(*) FROM main.trips")
    new = [s for s in after if s not in before]
    assert len(new) == 1 and new[0][1].startswith(f"load {load_id}: 1 file(s), mode skip"), new
    snapshot, was = new[0][0], before[-1][0]
    assert summary.startswith(
        f"load {load_id}: snapshot {snapshot} (was {was}); {trips} rows loaded, {quarantined} quarantined; checks: "
    ), summary
    assert trips + quarantined == file_rows and total == trips  # this module's lake held no trips before
    cells = page.locator("[data-testid=load-files] tbody tr").all_inner_texts()
    assert [c.split("\t")[:6] for c in cells] == [
        [trips_file.name, "2024-02", "loaded", str(file_rows), str(trips), str(quarantined)]
    ]
    # the load ran as the console's user (the service user, as root): its state folder's Spark log is that user's
    spark_log = console_mod.folder(module_stack.state) / "load" / "logs" / "spark.log"
    assert pwd.getpwuid(spark_log.stat().st_uid).pw_name == web["user"]
    checks = [c.split("\t")[:2] for c in page.locator("[data-testid=load-checks] tbody tr").all_inner_texts()]
    assert ["the load made exactly one snapshot", "ok"] in checks
    assert checks and all(ok == "ok" for _name, ok in checks), checks
