"""Start-up: importing the CLI (what `--help` and every command pay) loads no Spark, pyarrow, pandas, psutil,
matplotlib, Dask, boto3 or sqlglot; those load with the commands that use them (`up` and `status` load Dask for the
workers and boto3 for the S3 check; `sql` loads sqlglot only for text that may hold a dynamic-table statement)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyspark", "pyarrow", "pandas", "psutil", "matplotlib", "distributed", "boto3", "botocore", "sqlglot")


def test_the_cli_imports_nothing_heavy():
    probe = f"import sys; import ducklake_kit.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_probe_sees_a_heavy_import():  # the check above can fail: importing a lesson pulls pyarrow in
    probe = (
        "import sys; import ducklake_kit.lessons.queries, ducklake_kit.taxi.synthetic; print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True"


def test_plain_sql_is_not_tokenized_for_dynamic_table_statements():
    # `sql` asks whether its text holds a dynamic-table statement before it runs it: text without the word DYNAMIC
    # cannot, and is not tokenized (no sqlglot); text with it is, and the answer is still sqlglot's (a string here)
    probe = (
        "import sys; from ducklake_kit.cli.data import _dynamic_sql\n"
        "first = _dynamic_sql(None, None, 'SELECT 1', None), 'sqlglot' in sys.modules\n"
        "second = _dynamic_sql(None, None, \"SELECT 'a dynamic table'\", None), 'sqlglot' in sys.modules\n"
        "print(first, second)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "(None, False) (None, True)"
