"""The Load page in a real browser: a file of trips (the offline generator's, tiny) loaded through the kit's own
PySpark `load`, its progress seen while it runs, a second load refused while it runs, the page left and found again,
then the page's snapshot and rows compared with the catalog's and the lake's; a bad path is one line and no snapshot;
a load cancelled while it waits before its commit (the load's pause-before-commit hook) leaves no process and the
lake as it was, and the page says so. A lake of its own (module_stack: the load writes main.trips, which the
session's other tests read), one console."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.platforms import console as console_mod
from ducklake_kit.taxi.load import snapshot_of_load
from ducklake_kit.workers import plane

ROWS = 300


@pytest.fixture(scope="module")
def resume():
    """The file that ends the load's pause before its commit (faults.pause): there, a load does not wait; removed, the
    console's next load waits before its commit (up to 10 minutes). In a folder the service user can look in."""
    folder = Path(tempfile.mkdtemp(prefix="ducklake-console-resume-"))
    folder.chmod(0o755)
    path = folder / "resume"
    path.touch()
    try:
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _console(s, fault: str, resume: Path) -> dict:
    """Start the console of stack `s` as a user starts it (see tests/console/consoles.py), its `--json` result, with
    the load's test hook `fault` armed in its environment (which its loads inherit): a load pauses there while
    `resume` is absent."""
    hook = {"DUCKLAKE_FAULT": fault, "DUCKLAKE_FAULT_RESUME_FILE": str(resume)}
    made = CliRunner().invoke(app, ["console", "--json"], env={**s.env, **hook, "COLUMNS": "200"})
    assert made.exit_code == 0, made.output
    return json.loads(made.stdout)["result"]


@pytest.fixture(scope="module")
def web(module_stack, resume):
    """The console of this module's own lake (one worker), its loads pausing before their commit while `resume` is
    absent."""
    plane.up(module_stack.state, module_stack.platform.endpoints(), 1)
    try:
        yield _console(module_stack, "pause-before-commit=600", resume)
    finally:
        console_mod.stop(module_stack.state)


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


def test_a_file_loads_with_progress_and_the_catalog_agrees(page, web, module_stack, trips_file, cli):
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
    # the console chose the id (`--load-id`), and the lookup a cancelled load's fate rests on finds its commit
    assert page.locator("[data-testid=load-state]").inner_text().startswith(f"load {load_id} of 1 file(s)")
    with Lake(module_stack.platform.endpoints()) as lake:
        assert snapshot_of_load(lake, load_id) == snapshot
    # an id the lake has seen, or not one the load makes, is refused in one line before Spark starts, lake untouched
    for given, says in [
        (
            load_id,
            f"Error: the load id {load_id} is already in the lake (snapshot {snapshot}). Try: leave --load-id out",
        ),
        ("0123456789AB", "Error: the load id '0123456789AB' is not 12 hex digits (0-9, a-f)."),
    ]:
        refused = cli(module_stack.env, "load", "--source", "files", "--path", str(trips_file), "--load-id", given)
        assert refused.exit_code == 3, refused.output
        assert refused.stderr.startswith(says) and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    with Lake(module_stack.platform.endpoints()) as lake:
        assert _snapshots(lake) == after
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


def _group(pgid: int) -> list[tuple[int, str, str]]:
    """The live processes of group `pgid` (pid, state, command name), as ps lists them (zombies left out)."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,comm="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()]
    return [(int(p), st, comm) for p, g, st, comm in rows if int(g) == pgid and not st.startswith("Z")]


def _load_pid(load_id: str) -> int:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    found = [int(line.split(None, 1)[0]) for line in out.splitlines() if f"--load-id {load_id} " in line]
    assert len(found) == 1, out
    return found[0]


@pytest.fixture
def folder():
    """A folder the console's user (the service user, as root) can read: not pytest's tmp_path (0700 above it)."""
    path = Path(tempfile.mkdtemp(prefix="ducklake-console-cancel-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _month(folder: Path, month: int) -> Path:
    """A month of synthetic trips no other test loads."""
    from ducklake_kit.taxi import synthetic

    path = folder / synthetic.month_file_name(2024, month)
    synthetic.generate_month(path, 2024, month, ROWS, seed=20 + month)
    path.chmod(0o644)
    return path


def _cancel_while_paused(page, web, trips: Path) -> tuple[str, int, str]:
    """Load `trips` on the page, wait for the load's test hook to pause it, see its JVM in its process group, press
    Cancel (first keeping it running once), then wait for the page's line: (load id, process group, line)."""
    from playwright.sync_api import expect

    _open(page, web)
    assert page.locator("[data-testid=load-cancel]").is_hidden()  # nothing runs: no Cancel
    page.locator("[data-testid=load-path]").fill(str(trips))
    page.locator("[data-testid=load-run]").click()
    page.wait_for_selector("[data-testid=load-running]")  # this load, not the last one (a load that ended)
    load_id = page.locator("[data-testid=load-state]").inner_text().split()[1]
    expect(page.locator("[data-testid=load-progress]")).to_contain_text("test hook:", timeout=600_000)
    pgid = _load_pid(load_id)
    alive = _group(pgid)
    assert any(comm == "java" for _p, _s, comm in alive), alive  # Spark's JVM runs in the load's group
    # Cancel asks first; keeping it running keeps it running
    page.locator("[data-testid=load-cancel]").click()
    page.locator("[data-testid=load-cancel-keep]").click()
    page.wait_for_timeout(500)
    assert _group(pgid) and page.locator("[data-testid=load-stopped]").count() == 0
    page.locator("[data-testid=load-cancel]").click()
    page.locator("[data-testid=load-cancel-confirm]").click()
    stopped = page.locator("[data-testid=load-stopped]")
    stopped.wait_for(timeout=120_000)
    assert "cancelled" in page.locator("[data-testid=load-state]").inner_text()
    assert page.locator("[data-testid=load-cancel]").is_hidden()
    return load_id, pgid, stopped.inner_text()


def _rows(lake: Lake) -> dict[str, int]:
    """The rows of the load's tables that exist (none before the module's first load commits)."""
    return {
        t: lake.scalar(f"SELECT count(*) FROM main.{t}")
        for t in ("trips", "quarantine", "zones", "load_log")
        if table_exists(lake.con, lake.alias, "main", t)
    }


def test_a_load_cancelled_before_its_commit_leaves_the_lake_and_no_process(page, web, module_stack, resume, folder):
    """Cancel pressed while the load waits before its commit (every data file written, none registered): its
    process group ends, Spark's JVM with it, the page says nothing was committed, and the catalog's snapshots and
    the tables' rows are as before."""
    month = _month(folder, 3)
    with Lake(module_stack.platform.endpoints()) as lake:
        before, rows_before = _snapshots(lake), _rows(lake)
    resume.unlink()
    try:
        load_id, pgid, line = _cancel_while_paused(page, web, month)
    finally:
        resume.touch()
    assert line.startswith(f"load {load_id} cancelled: nothing was committed, the lake is as it was"), line
    assert "maintain --dead-loads" in line, line
    assert _group(pgid) == []  # the load, its JVM and Spark's Python workers: all gone
    with Lake(module_stack.platform.endpoints()) as lake:
        assert _snapshots(lake) == before
        assert _rows(lake) == rows_before
        assert snapshot_of_load(lake, load_id) is None


@pytest.mark.usefixtures("web")  # its worker plane (the console's Query page needs one), and its stop at the end
def test_a_load_cancelled_after_its_commit_is_named_by_its_snapshot(browser, module_stack, resume, folder):
    """Cancel pressed while the load waits after its commit, before its result: the page names the snapshot the
    lake holds for it, which holds every row of the file. The console is started again with that hook armed (last
    in the module: it replaces the console the other tests used), on a page of its own."""
    console_mod.stop(module_stack.state)
    web = _console(module_stack, "pause-after-load-commit=600", resume)
    month = _month(folder, 4)
    with Lake(module_stack.platform.endpoints()) as lake:
        before = _snapshots(lake)
    context = browser.new_context()
    resume.unlink()
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(web["url_with_token"])
        page.wait_for_selector("[data-testid=run]")
        load_id, pgid, line = _cancel_while_paused(page, web, month)
    finally:
        resume.touch()
        context.close()
    assert _group(pgid) == []
    with Lake(module_stack.platform.endpoints()) as lake:
        new = [s for s in _snapshots(lake) if s not in before]
        rows = lake.con.execute(
            "SELECT (SELECT count(*) FROM main.trips WHERE load_id = ?) + "
            "(SELECT count(*) FROM main.quarantine WHERE load_id = ?)",
            [load_id, load_id],
        ).fetchone()[0]
    assert len(new) == 1 and new[0][1].startswith(f"load {load_id}: 1 file(s)"), new
    assert line.startswith(f"load {load_id} cancelled after its commit: snapshot {new[0][0]} holds its rows"), line
    assert rows == ROWS
