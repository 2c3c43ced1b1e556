"""The load as the harness runs it: resolve the sources, run the Spark load, then check it against the source."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import (
    MODES,
    LoadInput,
    LoadResult,
    check_load_id,
    load_snapshots,
    rows_snapshots,
    run_load,
)
from ducklake_kit.taxi.verify import replace_kept_other_periods, verify_file

SPARK_LOG = "spark.log"  # in the state folder's logs/: the JVM's own output when a load starts it


@dataclass(frozen=True)
class LoadSpec:
    """Which trips a load reads (see `sources.resolve`) and how it treats files already loaded (`MODES`)."""

    source: str = "auto"
    months: str = sources.DEFAULT_MONTHS
    paths: list[str] = field(default_factory=list)
    rows_per_month: int = sources.DEFAULT_ROWS_PER_MONTH
    seed: int = 0
    mode: str = "skip"
    load_id: str | None = None  # the caller's (`load --load-id`), else the load makes one


def load_checked(
    kit: Kit, spec: LoadSpec, checks: CheckRun | None = None, *, verify_skipped: bool = True
) -> tuple[LoadResult, CheckRun]:
    """The load as `load` runs it: resolve the sources, run the Spark load, then check it against the source
    (`verify_skipped`: the files it skipped too, against their earlier load's raw copy)."""
    mode, state, report = spec.mode, kit.state, kit.reporter
    if mode not in MODES:  # before anything is downloaded or generated
        raise KitError(f"unknown mode '{mode}'", f"choose one of: {', '.join(MODES)}")
    if spec.load_id is not None:
        check_load_id(spec.load_id)
    checks = checks if checks is not None else CheckRun()
    ep = kit.platform.endpoints()
    target = spark_mod.target(kit.spark_master, state)  # before any file is made: `standalone` must be running
    cache = state.cache_dir
    files, note = sources.resolve(
        spec.source, cache, months=spec.months, paths=spec.paths, rows_per_month=spec.rows_per_month, seed=spec.seed
    )
    report.say(f"source: {note}; {len(files)} file(s)")
    zones_path, zones_note = sources.zone_lookup(cache, [f.path for f in files])
    result = run_load(
        replace(kit, spark_master=target),
        LoadInput(files, zones_path, zones_note, note),
        mode=mode,
        spark_log=state.log_dir / SPARK_LOG,
        load_id=spec.load_id,
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
            to_verify = result.files if verify_skipped else loaded
            with report.progress("checking files against the source", len(to_verify), "files") as bar:
                for fr in to_verify:
                    verify_file(lake, fr, fr.load_id, checks)
                    bar.advance()
    return result, checks
