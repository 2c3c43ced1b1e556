"""What `--platform podman` needs on the machine: podman, runc, mmdebstrap and the containers.conf the kit ships.

Each item is a `Tool` (platforms.prerequisite, shared with `doctor`, which prints them beside the others; this
module does not import doctor, which imports it).
The conf is checked twice: its own settings (read with tomllib), and what podman reports when pointed at it
(`podman info`: the OCI runtime it would use), so a conf that podman ignores or reads differently shows too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.prerequisite import Tool

CONTAINERS_CONF = Path(__file__).with_name("podman") / "containers.conf"
INSTALL = "`sudo apt-get install podman runc mmdebstrap` (Debian 12 or newer; podman 4.3+)"
WHY = "the podman platform plays the overlay as pods"
RUNTIME = "runc"  # crun 1.8.1 refuses hybrid cgroups; runc runs there
ULIMITS = ("nofile", "nproc")  # root without CAP_SYS_RESOURCE cannot raise them to podman's defaults


def podman_env(conf: Path = CONTAINERS_CONF) -> dict[str, str]:
    """The environment for every podman call of the kit: this process's, with CONTAINERS_CONF set to the conf."""
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def run(
    argv: list[str], what: str, *, timeout: float, stdin: bytes | None = None, check: bool = True, slow: str = ""
) -> subprocess.CompletedProcess[bytes]:
    """A podman (or mmdebstrap) command of the kit, with the conf: a timeout, a missing tool or (with `check`) a failure
    is one KitError naming `what` (the tool's last line of output, the rest as detail). `slow`: the fix for a timeout."""
    try:
        out = subprocess.run(
            argv,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=podman_env(),
        )
    except subprocess.TimeoutExpired:
        raise KitError(
            f"{what} did not finish in {timeout:.0f}s", slow or "run it again; the machine may be busy"
        ) from None
    except OSError as exc:
        raise KitError(f"{what} could not start ({exc.strerror})", INSTALL) from None
    if check and out.returncode != 0:
        err = (out.stderr or out.stdout).decode(errors="replace").strip()
        last = err.splitlines()[-1] if err else "no output"
        raise KitError(f"{what} failed: {last}", "read the output below", detail=err[-3000:])
    return out


def _output(argv: list[str], env: dict[str, str] | None = None, timeout: float = 20) -> tuple[int, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, f"`{' '.join(argv)}` did not answer in {timeout:.0f}s"
    except OSError as exc:
        return -1, exc.strerror or str(exc)
    return out.returncode, (out.stdout + out.stderr).strip()


def _version(text: str) -> str:
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else (text.splitlines()[0] if text else "")


def conf_problems(conf: Path = CONTAINERS_CONF) -> list[str]:
    """What is wrong with the conf's own settings, or [] when it holds what the kit needs."""
    try:
        settings = tomllib.loads(conf.read_text())
    except OSError as exc:
        return [f"{conf} cannot be read ({exc.strerror})"]
    except tomllib.TOMLDecodeError as exc:
        return [f"{conf} is not valid TOML ({exc})"]
    problems = []
    runtime = settings.get("engine", {}).get("runtime")
    if runtime != RUNTIME:
        problems.append(f"[engine] runtime is {runtime!r}, not {RUNTIME!r}")
    limits = settings.get("containers", {}).get("default_ulimits", [])
    for name in ULIMITS:
        if not any(str(limit).startswith(f"{name}=") for limit in limits):
            problems.append(f"[containers] default_ulimits sets no {name}")
    return problems


def _tool(name: str, required: bool, why: str) -> Tool:
    path = shutil.which(name)
    if path is None:
        return Tool(name, False, "not found", required, INSTALL, why)
    code, text = _output([path, "--version"])
    return Tool(name, code == 0, _version(text) if code == 0 else f"does not run: {text[:120]}", required, INSTALL, why)


def _conf_tool(required: bool, podman: Tool) -> Tool:
    hint = f"restore {CONTAINERS_CONF} from the repository (the kit points CONTAINERS_CONF at it)"
    problems = conf_problems()
    if not problems and podman.found:
        # What podman itself reads from it: a conf it cannot parse, or ignores, shows here.
        code, text = _output(
            [shutil.which("podman") or "podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], env=podman_env()
        )
        if code != 0:
            problems.append(f"`podman info` fails with it: {text.splitlines()[-1] if text else 'no output'}")
            hint = f"{INSTALL}; then read the error of `CONTAINERS_CONF={CONTAINERS_CONF} podman info`"
        elif text != RUNTIME:
            problems.append(f"podman runs containers with {text!r}, not {RUNTIME!r}")
    if problems:
        return Tool("containers.conf", False, "; ".join(problems), required, hint, "podman's settings for the kit")
    read = "read by podman: runtime runc" if podman.found else "settings valid (podman not found to read it)"
    return Tool("containers.conf", True, read, required, hint, "podman's settings for the kit")


def check(required: bool) -> list[Tool]:
    """The podman platform's prerequisites; `required` when the platform asked for is podman."""
    podman = _tool("podman", required, WHY)
    return [
        podman,
        _tool("runc", required, "the OCI runtime podman uses here (crun refuses hybrid cgroups)"),
        _tool("mmdebstrap", required, "builds the images' Debian base without a registry"),
        _conf_tool(required, podman),
    ]
