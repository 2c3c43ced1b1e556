# ducklake-kit: `just` lists the recipes. The two that matter: `just ducklake-test` and `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

# uv must never try to download a Python interpreter (no internet beyond the package registries)
export UV_PYTHON_DOWNLOADS := "never"

uv := "scripts/uv.sh"
kit := "scripts/uv.sh run --frozen python ducklake_test.py"
# what `just test-containers` runs by default, and CI: `all` through --platform external (every stage's checks), the
# lake layer and the worker plane, on containers (docs/development.md says why these and not the whole suite)
containers_tests := "tests/cli/test_cli.py tests/lake tests/workers/test_workers.py"
# `just test` runs in two pytest processes, each on stacks of its own; a module runs whole in one of them and the
# modules that share something run in one group (tests/conftest.py: SHARED_GROUPS), the longest groups first
xdist := "-n 2 --dist loadfile --no-loadscope-reorder"

# list the recipes
default:
    @just --list --unsorted

# the whole flow, checked: up, buckets, snapshots and time travel, the taxi load through PySpark; exit 0 only if all hold
[group('main')]
ducklake-test platform="local": setup
    {{kit}} --platform {{platform}} all

# run the test suite (real PostgreSQL and S3, started by the tests) in two processes; extra args go to pytest (`-n 0`: one process)
[group('main')]
test *args: setup
    {{uv}} run --frozen pytest {{xdist}} {{args}}

# the tests that start no service (no PostgreSQL, S3, Dask or Spark): the quick loop while editing; extra args go to pytest
[group('main')]
test-fast *args: setup
    {{uv}} run --frozen pytest -m "not service" {{args}}

# the integration tests against containers (testcontainers on podman's Docker API, a unix socket; the kit's images); args go to pytest (default: CI's subset)
[group('main')]
test-containers *args: setup
    DUCKLAKE_TEST_BACKEND=containers {{uv}} run --frozen python -m ducklake_kit.platforms.podman_service -- python -m pytest {{ if args == "" { containers_tests } else { args } }}

# build the manual in docs/ as a site into site/ (--strict: a broken link or anchor, or a page missing from the nav, fails it) and check that docs/cli.md matches --help
[group('main')]
docs: setup
    {{uv}} run --frozen python -m ducklake_kit.cli.reference --check
    NO_MKDOCS_2_WARNING=1 {{uv}} run --frozen mkdocs build --strict

# lint and format check with ruff (pinned in uv.lock; its rules and the reasons for the ones left out are in pyproject.toml)
[group('main')]
lint: setup
    {{uv}} run --frozen ruff check .
    {{uv}} run --frozen ruff format --check .

# rewrite the code as `just lint` wants it: ruff's safe fixes, then the formatter
[group('main')]
fmt: setup
    {{uv}} run --frozen ruff check --fix .
    {{uv}} run --frozen ruff format .

# --compile-bytecode: every process the kit starts (the CLI, Spark's Python workers, the benchmark's writers,
# notebook kernels) imports pandas, pyarrow and pyspark from .pyc files, also where PYTHONDONTWRITEBYTECODE is set
# (measured here: 4.6 s -> 1.5 s for those imports). The kit's own package is installed editable, which uv does not
# compile: compileall writes its .pyc files (only those older than their source), or, where Python may not write
# them, every process compiled the ~60-150 modules it imports from source (`sql` took 0.12 s more CPU each time)

# install the pinned environment from uv.lock, its bytecode compiled (idempotent: fast when nothing changed)
[group('setup')]
setup:
    @command -v python3 >/dev/null || { echo "Error: python3 not found. Try: install Python 3.11+." >&2; exit 3; }
    {{uv}} sync --frozen --quiet --compile-bytecode
    {{uv}} run --frozen --no-sync python -m compileall -q src

# check prerequisites with versions and install hints
[group('setup')]
doctor platform="local": setup
    {{kit}} --platform {{platform}} doctor

# start PostgreSQL (catalog), the S3 store and the worker plane (idempotent), e.g. just up local 3
[group('lake')]
up platform="local" workers="": setup
    {{kit}} --platform {{platform}} up {{ if workers != "" { "--workers " + workers } else { "" } }}

# show the services' health, ports and data sizes, and the workers
[group('lake')]
status platform="local": setup
    {{kit}} --platform {{platform}} status

# list the worker plane's workers: name, pid, state, tasks run, memory, worker-local tables
[group('lake')]
workers platform="local": setup
    {{kit}} --platform {{platform}} workers

# stop the console, the worker plane and the services (data stays)
[group('lake')]
down platform="local": setup
    {{kit}} --platform {{platform}} down

# how to reach the catalog and the lake with psql, the DuckDB CLI and DBeaver
[group('lake')]
connect platform="local": setup
    {{kit}} --platform {{platform}} connect

# start the lake console (Query and Lake pages) in the background and print its URL with its token; `just down` stops it
[group('lake')]
console platform="local": setup
    {{kit}} --platform {{platform}} console

# run SQL against the lake, e.g. just sql "FROM ducklake_snapshots('lake')" (after `--`: text may start with a comment)
[group('lake')]
sql query platform="local": setup
    {{kit}} --platform {{platform}} sql -- {{quote(query)}}

# stop the services and delete their data and credentials
[group('lake')]
[confirm("Delete the catalog, the lake data and the credentials in the state folder?")]
reset platform="local": setup
    {{kit}} --platform {{platform}} reset --yes

# start the kit's Spark cluster: standalone (a master and N workers) or connect (a Spark Connect server), e.g. just spark-up connect
[group('spark')]
spark-up mode="standalone" spark_workers="": setup
    {{kit}} spark up --mode {{mode}} {{ if spark_workers != "" { "--spark-workers " + spark_workers } else { "" } }}

# the Spark master, its workers and the Connect server: pid, port, a real round trip
[group('spark')]
spark-status: setup
    {{kit}} spark status

# stop the Connect server, the workers and the master (and any executor they left)
[group('spark')]
spark-down: setup
    {{kit}} spark down

# open the guided notebooks in JupyterLab with the kit's environment (uv run installs JupyterLab on first use); args go to jupyter lab
[group('lab')]
notebooks *args:
    {{uv}} run --frozen --group notebooks jupyter lab notebooks/ $([ "$(id -u)" = 0 ] && echo --allow-root) {{args}}

# create or start the k3d cluster, apply overlays/local, port-forward PostgreSQL and S3 (idempotent)
[group('k3d')]
cluster-up: setup
    {{kit}} --platform k3d up

# the cluster, its pods (phase, readiness, restarts) and the port-forwards (pid, port, a real round trip)
[group('k3d')]
cluster-status: setup
    {{kit}} --platform k3d status

# stop the port-forwards and the cluster; data kept (`just reset k3d` deletes the cluster and its data)
[group('k3d')]
cluster-down: setup
    {{kit}} --platform k3d down
