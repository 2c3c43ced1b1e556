"""Start-up: importing the CLI (what `--help` and every command pay) loads no Spark, pyarrow, pandas, psutil,
matplotlib or Dask; those load with the commands that use them (`up` and `status` load Dask for the workers)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyspark", "pyarrow", "pandas", "psutil", "matplotlib", "distributed")


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
