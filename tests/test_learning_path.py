"""LEARNING_PATH.md cannot silently rot: every lab's steps and Verify commands run, in order, on a fresh local stack.

A lab's fenced `bash` blocks run line by line from the project root (as a learner types them, with the venv's
`python` first on PATH); every line must exit 0. A `text` block right after a Verify block lists lines its output
must contain. The documented default ports (PostgreSQL, S3, the Dask scheduler and its dashboard) and `.ducklake/`
are rewritten to the test stack's.
A block preceded by `<!-- not run by the lab test: why -->` is skipped; `<!-- needs: docker -->` runs only where
a Docker engine and k3d answer. A lab with `<!-- needs: podman -->` blocks (17) runs where podman can run pods, in a
state folder and on ports of its own (not the local stack's: the worker plane belongs to a state folder, and two
platforms in one folder share it), with its pods' names rewritten to that folder's; its pods, volumes and secrets
are reset afterwards. An `export` line sets the variable for the lab's later lines, as in the learner's shell.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ducklake_kit.platforms import podman_doctor
from ducklake_kit.platforms.podman import name_prefix
from ducklake_kit.platforms.procs import free_port
from ducklake_kit.platforms.state import (
    DEFAULT_DASHBOARD_PORT,
    DEFAULT_PG_PORT,
    DEFAULT_S3_PORT,
    DEFAULT_SCHEDULER_PORT,
)

ROOT = Path(__file__).resolve().parents[1]
LAB_HEADING = re.compile(r"^## (\d\d) · (.+)$", re.M)
BLOCK = re.compile(r"(?:<!-- (?P<note>[^>]*) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)


@dataclass
class Block:
    lang: str
    body: str
    note: str = ""
    expected: list[str] = field(default_factory=list)


@dataclass
class Lab:
    number: str
    title: str
    text: str
    steps: list[Block]
    verify: list[Block]


def parse_labs(markdown: str) -> list[Lab]:
    heads = list(LAB_HEADING.finditer(markdown))
    labs = []
    for i, h in enumerate(heads):
        text = markdown[h.end() : heads[i + 1].start() if i + 1 < len(heads) else len(markdown)]
        steps_part, _, rest = text.partition("**Verify:**")
        verify_part = rest.partition("**Next:**")[0]
        labs.append(Lab(h.group(1), h.group(2), text, _blocks(steps_part), _blocks(verify_part)))
    return labs


def _blocks(part: str) -> list[Block]:
    out: list[Block] = []
    for m in BLOCK.finditer(part):
        if m.group("lang") == "text":
            assert out and out[-1].lang == "bash", "a `text` block must follow the command block it describes"
            out[-1].expected += [line.strip() for line in m.group("body").splitlines() if line.strip()]
        else:
            out.append(Block(m.group("lang"), m.group("body"), m.group("note") or ""))
    return out


LABS = parse_labs((ROOT / "LEARNING_PATH.md").read_text())


def test_every_lab_has_the_shape_purpose_steps_verify_next():
    assert [lab.number for lab in LABS] == sorted(lab.number for lab in LABS), "labs are numbered in order"
    assert LABS[0].title == "Prerequisites" and LABS[-1].title == "Teardown"
    for lab in LABS:
        positions = [lab.text.find(f"**{part}:**") for part in ("Purpose", "Steps", "Verify", "Next")][
            : 4 if lab is not LABS[-1] else 3
        ]
        assert -1 not in positions and positions == sorted(positions), (
            f"lab {lab.number}: Purpose, Steps, Verify, Next in order"
        )
        runnable = [b for b in lab.verify if b.lang == "bash" and not b.note.startswith("not run")]
        assert runnable, f"lab {lab.number} has no Verify command the test can run"


def test_the_parser_finds_a_failing_verification():
    # the harness below must be able to fail: a made-up lab whose Verify expects a wrong answer
    lab = parse_labs(
        "## 01 · X\n**Purpose:** p\n**Steps:** s\n**Verify:**\n```bash\necho 41\n```\n```text\n42\n```\n**Next:** n\n"
    )[0]
    with pytest.raises(AssertionError, match="expected line '42'"):
        _run_block(lab.verify[0], os.environ.copy(), {})


def _docker_and_k3d() -> str | None:
    """None when a cluster could be made here, else the reason it cannot."""
    if not shutil.which("k3d"):
        return "k3d is not installed"
    try:
        ok = subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return None if ok else "no Docker engine answers"


SHELL_OWN = {"_", "PWD", "OLDPWD", "SHLVL"}  # what bash sets by itself, not what an `export` line set


def _run_block(block: Block, env: dict[str, str], rewrites: dict[str, str]) -> str:
    """Run the block's lines; an `export` line updates `env` for the lines after it."""
    output = ""
    for line in block.body.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for old, new in rewrites.items():
            line = line.replace(old, new)
        if line.startswith("export "):
            r = subprocess.run(["bash", "-c", f"{line}\nenv -0"], cwd=ROOT, env=env, capture_output=True, text=True)
            assert r.returncode == 0, f"`{line}` exited {r.returncode}:\n{r.stderr[-3000:]}"
            exported = dict(item.split("=", 1) for item in r.stdout.split("\0") if "=" in item)
            env.update({k: v for k, v in exported.items() if k not in SHELL_OWN and env.get(k) != v})
            continue
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, f"`{line}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        output += r.stdout + r.stderr
    for expected in block.expected:
        for old, new in rewrites.items():
            expected = expected.replace(old, new)
        assert expected in output, f"expected line '{expected}' not in the output of:\n{block.body}\n{output[-3000:]}"
    return output


def _needs_podman(lab: Lab) -> bool:
    return any(b.note.startswith("needs: podman") for b in lab.steps + lab.verify)


@dataclass
class PodmanLab:
    """The podman lab's own state folder, ports and pod names: the env and rewrites its lines run with."""

    home: Path
    env: dict[str, str]
    rewrites: dict[str, str]

    def kit(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "ducklake_test.py", "--platform", "podman", *args],
            cwd=ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture(scope="module")
def podman_lab() -> Iterator[PodmanLab]:
    missing = [t for t in podman_doctor.check(required=True) if not t.ok]
    if missing:
        pytest.skip(f"the podman lab needs {', '.join(f'{t.name} ({t.version})' for t in missing)}: {missing[0].hint}")
    home = Path(tempfile.mkdtemp(prefix="ducklake-podman-lab-"))
    home.chmod(0o711)  # as root, the worker plane runs as another user, who must traverse it
    prefix = name_prefix(home)
    lab = PodmanLab(
        home,
        {
            "DUCKLAKE_HOME": str(home),
            **{
                name: str(free_port())
                for name in (
                    "DUCKLAKE_PG_PORT",
                    "DUCKLAKE_S3_PORT",
                    "DUCKLAKE_SCHEDULER_PORT",
                    "DUCKLAKE_DASHBOARD_PORT",
                )
            },
        },
        {
            "ducklake-postgres-0": f"{prefix}postgres-0",
            "ducklake-rclone-s3-0": f"{prefix}rclone-s3-0",
            ".ducklake/": f"{home}/",
        },
    )
    try:
        yield lab
    finally:
        # the pods, their secrets and volumes, and the plane of this folder; then the folder
        reset = lab.kit("reset", "--yes")
        shutil.rmtree(home, ignore_errors=True)
        assert reset.returncode == 0, reset.stderr


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.parametrize("lab", LABS, ids=[f"{lab.number}-{lab.title.split()[0].lower()}" for lab in LABS])
def test_lab(lab: Lab, lab_stack, request: pytest.FixtureRequest):
    env = {
        **os.environ,
        **lab_stack.env,
        "COLUMNS": "200",
        "NO_COLOR": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    rewrites = {
        f"127.0.0.1:{DEFAULT_S3_PORT}": f"127.0.0.1:{lab_stack.s3_port}",
        f"127.0.0.1:{DEFAULT_PG_PORT}": f"127.0.0.1:{lab_stack.pg_port}",
        f"127.0.0.1:{DEFAULT_SCHEDULER_PORT}": f"127.0.0.1:{lab_stack.scheduler_port}",
        f"127.0.0.1:{DEFAULT_DASHBOARD_PORT}": f"127.0.0.1:{lab_stack.dashboard_port}",
        ".ducklake/": f"{lab_stack.home}/",
    }
    if _needs_podman(lab):
        podman_lab: PodmanLab = request.getfixturevalue("podman_lab")  # skips, with the reason, without podman
        env.update(podman_lab.env)
        rewrites = podman_lab.rewrites
    cluster_missing = (
        _docker_and_k3d() if any(b.note.startswith("needs: docker") for b in lab.steps + lab.verify) else None
    )
    skipped = []
    for block in lab.steps + lab.verify:
        if block.lang != "bash" or block.note.startswith("not run"):
            continue
        if block.note.startswith("needs: docker") and cluster_missing:
            skipped.append(block.body.strip().splitlines()[0])
            continue
        _run_block(block, env, rewrites)
    if skipped:
        pytest.skip(f"lab {lab.number}: the offline commands passed; not run ({cluster_missing}): {'; '.join(skipped)}")


PODMAN_LAB = next(lab for lab in LABS if _needs_podman(lab))


@pytest.mark.integration
def test_the_podman_labs_verify_fails_when_a_pod_is_stopped(podman_lab: PodmanLab):
    """The podman lab's Verify must be able to fail: with the catalog's pod stopped, its first line exits 1 and says
    why. Runs after the lab (which ended with `down`): it plays the pods again with the lab's own `up` line."""
    env = {
        **os.environ,
        **podman_lab.env,
        "COLUMNS": "200",
        "NO_COLOR": "1",
        # the lab's `python` is this venv's, as in test_lab (pytest may run without the venv on PATH)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    up = next(b for b in PODMAN_LAB.steps if "podman up" in b.body)
    _run_block(up, env, podman_lab.rewrites)
    pod = podman_lab.rewrites["ducklake-postgres-0"]
    stop = subprocess.run(
        ["podman", "pod", "stop", pod], env=podman_doctor.podman_env(), capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0, stop.stderr
    status_line = PODMAN_LAB.verify[0].body.splitlines()[0]
    assert status_line == "python ducklake_test.py --platform podman status", "the Verify starts with `status`"
    with pytest.raises(AssertionError, match=r"platform podman status` exited 1") as failed:
        _run_block(PODMAN_LAB.verify[0], env, podman_lab.rewrites)
    assert "readiness probe fails" in str(failed.value), str(failed.value)[-2000:]
