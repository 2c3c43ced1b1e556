"""Checked stories on the lake: foundation, queries, timetravel, maintain, and `all` (flow) that runs them in stages."""

# synthetic trips a month in the time-travel lesson's two loads (`timetravel`, `all`, notebook 03); here, not in
# the lesson's module, so the CLI can show the default without importing the lesson (and Spark's helpers)
LESSON_ROWS_PER_MONTH = 20_000
