"""Environments on the real lake and worker plane: `pipeline run --env dev` builds into `dev__<schema>`, reads prod
where dev has no table, and never touches prod.

The oracles: prod's tables hold the same rows and no snapshot of the dev run names a prod table (DuckLake's own
record of each snapshot's changes); the dev tables equal what the query computes, with different SQL, over the
tables it should have read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.pipelines import flow
from ducklake_kit.pipelines.runner import PipelineRun
from ducklake_kit.workers.config import PlaneConfig

PIPELINE = """
-- id: base
-- key: k
CREATE OR REPLACE TABLE {s}.base AS SELECT i AS k, {base};

-- id: top
-- audit: not_null(k)
CREATE OR REPLACE TABLE {s}.top AS
SELECT b.k, b.v + {add} AS v1 FROM {s}.base AS b JOIN {s}.src ON {s}.src.k = b.k;

-- id: plain
CREATE OR REPLACE TABLE {s}_plain AS SELECT count(*) AS n, sum(v) AS v FROM {s}.base;
"""
PROD_TABLES = ("base", "top")


class Env:
    """One schema with a source table, the pipeline over it, and the ways to run it and read the lake."""

    def __init__(self, stack, folder: Path, schema: str, lake: Lake):
        self.ep = stack.platform.endpoints()
        self.lake = lake
        self.address = PlaneConfig.of(stack.state, None).address
        self.cli_env = stack.env
        self.s = schema
        self.path = folder / f"{schema}.sql"
        self.write()
        lake.run(
            f"DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS dev__{schema} CASCADE; "
            f"DROP TABLE IF EXISTS {schema}_plain; CREATE SCHEMA {schema}; "
            f"CREATE TABLE {schema}.src AS SELECT i AS k FROM range(0, 6, 2) t(i)"
        )

    def write(self, m: int = 2, add: int = 1, base: str = "") -> None:
        base = base or f"i * {m} AS v FROM range(6) t(i)"
        self.path.write_text(PIPELINE.format(s=self.s, base=base, add=add))

    def run(self, **kw) -> PipelineRun:
        run = flow.run(self.path, self.address, self.ep, flow.Options(**kw)).run
        # the module's one connection reads the lake as the run left it (else the oracles would read old rows)
        assert self.rows(f"SELECT count(*) FROM main.pipeline_runs WHERE run_id = '{run.run_id}'") == [(1,)]
        return run

    def rows(self, sql: str) -> list[tuple]:
        return self.lake.con.execute(sql).fetchall()

    def prod(self) -> dict[str, list[tuple]]:
        out = {t: self.rows(f"SELECT * FROM {self.s}.{t} ORDER BY ALL") for t in PROD_TABLES}
        return out | {"plain": self.rows(f"SELECT * FROM {self.s}_plain")}

    def snapshot(self) -> int:
        return self.rows("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')")[0][0]

    def prod_ids(self) -> set[str]:
        return {
            str(r[0])
            for r in self.rows(
                "SELECT t.table_id FROM __ducklake_metadata_lake.ducklake_table t "
                "JOIN __ducklake_metadata_lake.ducklake_schema s USING (schema_id) "
                f"WHERE (s.schema_name = '{self.s}' OR t.table_name = '{self.s}_plain') AND t.end_snapshot IS NULL"
            )
        }

    def snapshots_since(self, first: int) -> list[tuple[dict, dict]]:
        """(changes, commit_extra_info) of every snapshot after `first`."""
        rows = self.rows(
            f"SELECT changes, commit_extra_info FROM ducklake_snapshots('lake') WHERE snapshot_id > {first}"
        )
        return [(changes, json.loads(extra) if extra else {}) for changes, extra in rows]


def statuses(run: PipelineRun) -> dict[str, str]:
    return {n.id: n.status for n in run.nodes}


@pytest.fixture
def env(stack, workers, lake, tmp_path, request):
    return Env(stack, tmp_path, f"pe_{request.node.name.removeprefix('test_')[:20]}", lake)


def prod_untouched(env: Env, before: dict, first: int, ids: set[str]) -> None:
    """Prod's rows are as they were, and no snapshot since `first` changed a prod table; each names the env."""
    assert env.prod() == before
    for changes, extra in env.snapshots_since(first):
        named = {str(v) for values in changes.values() for v in values}
        assert not named & ids, changes
        assert not {n for n in named if n.startswith(f"{env.s}.") or n == f"{env.s}_plain"}, changes
        assert extra.get("env") == "dev" and extra.get("commit"), extra


def test_a_dev_run_reads_prod_where_dev_has_no_table_and_never_writes_prod(env):
    assert statuses(env.run()) == dict.fromkeys(("base", "top", "plain"), "ok")
    before, first, ids = env.prod(), env.snapshot(), env.prod_ids()

    # dev has no base yet: `top`, edited and run alone in dev, reads prod's base (v = 2k)
    env.write(add=100)
    only_top = env.run(env="dev", select="top")
    assert statuses(only_top) == {"top": "ok"}
    assert env.rows(f"SELECT * FROM dev__{env.s}.top ORDER BY k") == [(k, 2 * k + 100) for k in (0, 2, 4)]
    assert env.rows(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'dev__{env.s}'") == [(1,)]
    prod_untouched(env, before, first, ids)

    # base edited too and the whole pipeline run in dev: top now reads dev's base (v = 3k), plain goes to dev__main
    env.write(m=3, add=100)
    whole = env.run(env="dev")
    assert statuses(whole) == dict.fromkeys(("base", "top", "plain"), "ok"), whole.nodes
    assert env.rows(f"SELECT * FROM dev__{env.s}.top ORDER BY k") == [(k, 3 * k + 100) for k in (0, 2, 4)]
    assert env.rows(f"SELECT * FROM dev__main.{env.s}_plain") == [(6, 3 * 15)]
    prod_untouched(env, before, first, ids)

    # change-aware per environment: dev again runs nothing; prod, whose file now differs, runs its changed nodes
    assert statuses(env.run(env="dev")) == dict.fromkeys(("base", "top", "plain"), "unchanged")
    lineage = env.rows(f"SELECT DISTINCT parent FROM lineage_tables WHERE child = 'dev__{env.s}.top' ORDER BY 1")
    assert lineage == [(f"dev__{env.s}.base",), (f"{env.s}.src",)]
    prod_again = env.run()
    assert statuses(prod_again) == dict.fromkeys(("base", "top", "plain"), "ok")
    assert env.rows(f"SELECT * FROM {env.s}.top ORDER BY k") == [(k, 3 * k + 100) for k in (0, 2, 4)]


def test_an_environment_name_that_cannot_name_a_schema_is_refused(env):
    for bad in ("prod", "Dev", "a__b", "dev-1"):
        with pytest.raises(KitError, match="cannot name an environment"):
            env.run(env=bad)
    assert env.rows(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name = '{env.s}'") == [(1,)]


def test_diff_says_per_table_what_except_all_says(env, cli):
    from collections import Counter

    from ducklake_kit.pipelines import environments

    env.run()
    # dev: keys 0 and 1 gone, 6..8 new, key 3 changed, keys 2, 4, 5 the same
    env.write(base="CASE WHEN i = 3 THEN 99 ELSE i * 2 END AS v FROM range(2, 9) t(i)")
    assert statuses(env.run(env="dev")) == dict.fromkeys(("base", "top", "plain"), "ok")
    got = {t.table: t for t in environments.diff(env.lake, "dev").tables}
    mine = {f"{env.s}.base", f"{env.s}.top", f"{env.s}_plain"}
    assert mine <= set(got)
    for name in mine:
        t = got[name]
        dev_rows = env.rows(f"SELECT * FROM {t.env_table}")
        prod_rows = env.rows(f"SELECT * FROM {t.table}")
        only_dev, only_prod = Counter(dev_rows) - Counter(prod_rows), Counter(prod_rows) - Counter(dev_rows)
        assert (t.env_rows, t.prod_rows) == (len(dev_rows), len(prod_rows))
        assert (t.only_in_env, t.only_in_prod) == (sum(only_dev.values()), sum(only_prod.values())), name
        assert t.same == (not only_dev and not only_prod)
    base = got[f"{env.s}.base"]
    assert base.key == ["k"]
    # the keys of the rows EXCEPT ALL finds on each side, independently of the diff's join
    plus = {r[0] for r in env.rows(f"SELECT k FROM (FROM {base.env_table} EXCEPT ALL FROM {base.table})")}
    minus = {r[0] for r in env.rows(f"SELECT k FROM (FROM {base.table} EXCEPT ALL FROM {base.env_table})")}
    assert (base.added, base.removed, base.changed) == (len(plus - minus), len(minus - plus), len(plus & minus))
    assert (base.added, base.removed, base.changed) == (3, 2, 1)
    assert base.examples == {"added": ["6", "7", "8"], "removed": ["0", "1"], "changed": ["3"]}
    assert got[f"{env.s}.top"].key == [] and got[f"{env.s}.top"].changed is None

    result = cli(env.cli_env, "pipeline", "diff", "dev", "--json")
    assert result.exit_code == 0, result.output
    envelope = json.loads(result.stdout)
    assert envelope["status"] == "ok" and envelope["catalog_info"]
    by_name = {t["table"]: t for t in envelope["result"]["tables"]}
    assert by_name[f"{env.s}.base"]["changed"] == 1 and by_name[f"{env.s}.base"]["same"] is False
    empty = cli(env.cli_env, "pipeline", "diff", "nothing_here")
    assert empty.exit_code == 3 and empty.stderr.strip().splitlines() == [
        "Error: environment nothing_here holds no table. Try: build one: `pipeline run FILE --env nothing_here`."
    ]


def table_ids(env: Env, names: list[str]) -> dict[str, int]:
    """schema.table -> its id in the catalog now."""
    rows = env.rows(
        "SELECT s.schema_name || '.' || t.table_name, t.table_id FROM __ducklake_metadata_lake.ducklake_table t "
        "JOIN __ducklake_metadata_lake.ducklake_schema s USING (schema_id) "
        "WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
    )
    return {n: i for n, i in rows if n in names}


def test_promote_is_one_snapshot_copying_no_data_and_prod_then_answers_devs_rows(env, cli):
    e = f"p{env.s[-6:]}"
    env.run()
    old_prod = env.prod()
    env.write(m=5, add=7)
    assert statuses(env.run(env=e)) == dict.fromkeys(("base", "top", "plain"), "ok")
    dev_names = [f"{e}__{env.s}.base", f"{e}__{env.s}.top", f"{e}__main.{env.s}_plain"]
    dev_rows = [env.rows(f"SELECT * FROM {n} ORDER BY ALL") for n in dev_names]
    ids = table_ids(env, dev_names)
    first = env.snapshot()

    # prod holds real tables: refused with one line, nothing changed
    refused = cli(env.cli_env, "pipeline", "promote", e)
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.strip().splitlines() == [
        f"Error: prod's {env.s}_plain is a table holding data, which a promote would replace with a view. Try: run "
        f"`pipeline promote {e} --migrate` once: it renames prod's tables aside (<name>__prod_v<N>, their data "
        "kept) in the same snapshot, and prod's names are views from then on."
    ]
    assert env.snapshot() == first and env.prod() == old_prod

    done = cli(env.cli_env, "pipeline", "promote", e, "--migrate", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)["result"]
    assert result["snapshot_id"] == first + 1 == env.snapshot()  # ONE snapshot
    promoted = {t["table"]: t for t in result["tables"]}
    assert set(promoted) == {f"{env.s}.base", f"{env.s}.top", f"{env.s}_plain"}
    # prod answers dev's rows, through views over the very tables dev built (same ids in the catalog: no copy)
    now = env.prod()
    assert [now["base"], now["top"], sorted(now["plain"])] == dev_rows
    physical = {p["physical"]: t for t, p in promoted.items()}
    moved = table_ids(env, list(physical))
    assert sorted(moved.values()) == sorted(ids.values()), (moved, ids)
    kinds = dict(
        env.rows(
            "SELECT table_schema || '.' || table_name, table_type FROM information_schema.tables "
            f"WHERE table_name IN ('base', 'top', '{env.s}_plain') AND table_schema IN ('{env.s}', 'main')"
        )
    )
    assert set(kinds.values()) == {"VIEW"}, kinds
    # the snapshot wrote no row but its own record (pipeline_promotions): DuckLake's record of its changes
    ((changes, extra),) = env.snapshots_since(first)
    record = table_ids(env, ["main.pipeline_promotions"])["main.pipeline_promotions"]
    written = {str(v) for k, vs in changes.items() if "insert" in k or "delete" in k for v in vs}
    assert written <= {str(record)}, changes
    assert extra["env"] == e and extra["commit"]
    # prod's old tables were renamed aside, not dropped
    for t in ("base", "top"):
        aside = env.rows(
            f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{env.s}' "
            f"AND table_name LIKE '{t}__prod_v%'"
        )
        assert len(aside) == 1 and env.rows(f"SELECT * FROM {env.s}.{aside[0][0]} ORDER BY ALL") == old_prod[t]
    # dev holds none of them now: its next run reads prod's views and builds again, prod untouched
    again_first, served = env.snapshot(), env.prod()
    assert statuses(env.run(env=e)) == dict.fromkeys(("base", "top", "plain"), "ok")
    assert env.prod() == served
    for changes, _extra in env.snapshots_since(again_first):
        assert not {str(v) for vs in changes.values() for v in vs} & {str(i) for i in ids.values()}, changes
    # prod's names are views now: a prod run of the file is refused in one line before it writes anything
    last = env.snapshot()
    with pytest.raises(KitError, match=f"prod's {env.s}.base is served by `pipeline promote`"):
        env.run()
    assert env.snapshot() == last


def test_a_promote_of_an_environment_with_a_failed_node_is_refused(env, cli):
    e = f"f{env.s[-6:]}"
    env.run()
    assert statuses(env.run(env=e)) == dict.fromkeys(("base", "top", "plain"), "ok")
    env.write(base="CAST('x' || i AS INTEGER) AS v FROM range(6) t(i)")
    failed = env.run(env=e)
    assert statuses(failed) == {"base": "failed", "top": "skipped", "plain": "skipped"}
    first, before = env.snapshot(), env.prod()
    refused = cli(env.cli_env, "pipeline", "promote", e, "--migrate")
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.strip().splitlines() == [
        f"Error: environment {e} has a failed node: base of pipeline {env.s}@{e} (run {failed.run_id}), so its "
        f"tables are not a whole pipeline's. Try: fix it and run again (`pipeline run FILE --env {e} "
        "--from-failed`), then promote."
    ]
    assert env.snapshot() == first and env.prod() == before


def test_a_promote_takes_whole_runs_only(env, cli):
    """A run of the environment in progress (its lock held, as a run holds it) refuses the promote; a dev table
    written after the last recorded run (what a run stopped midway leaves: its finished nodes committed, no history)
    refuses it, naming the table; a promote in progress refuses a run. Each refusal changes nothing."""
    e = f"w{env.s[-6:]}"
    env.run()
    assert statuses(env.run(env=e)) == dict.fromkeys(("base", "top", "plain"), "ok")
    name = f"{env.s}@{e}"
    first, before = env.snapshot(), env.prod()
    with flow._one_run_at_a_time(env.ep, name, "r-held"):
        refused = cli(env.cli_env, "pipeline", "promote", e, "--migrate")
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.startswith(f"Error: pipeline {name} is already running (run r-held);"), refused.stderr
    assert env.snapshot() == first and env.prod() == before

    env.rows(f"INSERT INTO {e}__{env.s}.base VALUES (99, 99)")  # after the last recorded run, by hand
    changed, last = (
        env.snapshot(),
        env.rows(f"SELECT max(snapshot_id) FROM pipeline_runs WHERE pipeline = '{name}'")[0][0],
    )
    refused = cli(env.cli_env, "pipeline", "promote", e, "--migrate")
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.strip().splitlines() == [
        f"Error: {e}__{env.s}.base changed at snapshot {changed}, after its last recorded run (snapshot {last}): a "
        f"run of environment {e} was stopped before it ended, or the table was written by hand, so its tables are "
        f"not a whole run's. Try: run it again (`pipeline run FILE --env {e}`), then promote."
    ]
    assert env.snapshot() == changed and env.prod() == before

    with flow._one_run_at_a_time(env.ep, name, f"promote {e}", flow.PROMOTE_HOLDER):
        with pytest.raises(KitError, match=rf"pipeline {name} is being promoted \(promote {e}\)"):
            env.run(env=e)
    assert env.snapshot() == changed
    assert statuses(env.run(env=e)) == dict.fromkeys(("base", "top", "plain"), "ok")  # a whole run again
    done = cli(env.cli_env, "pipeline", "promote", e, "--migrate")
    assert done.exit_code == 0, done.output
