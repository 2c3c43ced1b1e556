"""Checked stories on the lake, each of one shape: `run(kit, checks, **options) -> <Lesson>Result` (see result.py):
foundation, queries, timetravel, maintain, workers, pipeline, steps, dynamic. `all` (ducklake_kit/all.py) runs
them in stages."""

# synthetic trips a month in the time-travel lesson's two loads (`timetravel`, `all`, notebook 03); here, not in
# the lesson's module, so the CLI can show the default without importing the lesson (and Spark's helpers)
LESSON_ROWS_PER_MONTH = 20_000
