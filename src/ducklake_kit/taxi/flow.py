"""The load as the harness runs it: resolve the sources, run the Spark load, then check it against the source."""

from __future__ import annotations

from collections.abc import Callable

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.state import State
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import MODES, LoadResult, load_snapshots, rows_snapshots, run_load
from ducklake_kit.taxi.verify import replace_kept_other_periods, verify_file

SPARK_LOG = "spark.log"  # in the state folder's logs/: the JVM's own output when a load starts it


def load_and_verify(
    platform: Platform,
    state: State,
    *,
    source: str = "auto",
    months: str = sources.DEFAULT_MONTHS,
    paths: list[str] | None = None,
    rows_per_month: int = sources.DEFAULT_ROWS_PER_MONTH,
    seed: int = 0,
    mode: str = "skip",
    spark_master: str | None = None,
    on_step: Callable[[str], None] = lambda _m: None,
    checks: CheckRun | None = None,
    verify_skipped: bool = True,
) -> tuple[LoadResult, CheckRun]:
    if mode not in MODES:  # before anything is downloaded or generated
        raise KitError(f"unknown mode '{mode}'", f"choose one of: {', '.join(MODES)}")
    checks = checks if checks is not None else CheckRun()
    ep = platform.endpoints()
    target = spark_mod.target(spark_master, state)  # before any file is made: `standalone` must be running
    cache = state.cache_dir
    files, note = sources.resolve(
        source, cache, months=months, paths=paths or [], rows_per_month=rows_per_month, seed=seed
    )
    on_step(f"source: {note}; {len(files)} file(s)")
    zones_path, zones_note = sources.zone_lookup(cache, [f.path for f in files])
    result = run_load(
        ep,
        files,
        zones_path=zones_path,
        zones_note=zones_note,
        source_note=note,
        mode=mode,
        spark_master=target,
        on_step=on_step,
        spark_log=state.log_dir / SPARK_LOG,
    )
    with Lake(ep) as lake:
        loaded = [f for f in result.files if f.status == "loaded"]
        # the load's own snapshots, found by its commit message: other writers (another load, maintain, the worker
        # plane) may commit meanwhile, so how many snapshots the whole lake gained proves nothing
        mine = load_snapshots(lake, result.load_id)
        if loaded:
            checks.equal("the load made exactly one snapshot", mine, [result.snapshot_id])
            checks.equal(
                "every row the load wrote is in that snapshot",
                rows_snapshots(lake, result.load_id),
                [result.snapshot_id],
            )
        else:
            checks.equal("nothing new to load: no snapshot names this load", mine, [])
        if mode == "replace":  # a replace touches exactly what it names: every other period is as it was
            replace_kept_other_periods(lake, result, checks)
        if verify_skipped or loaded:
            # a skipped file's rows are those of the earlier load: they are checked against its raw copy too
            for fr in result.files if verify_skipped else loaded:
                verify_file(lake, fr, fr.load_id, checks)
    return result, checks
