"""The Kit: one run's context, the library's front door (as sqlmesh's Context is, but small). It carries where the
services run (the platform and its state folder), the worker plane (a user's Dask scheduler, or None for the kit's
own), where Spark runs, and the reporter that long work tells its progress to.

    kit = Kit.from_env()                       # a notebook: DUCKLAKE_* as the CLI reads them
    kit = Kit.on(stack.platform, stack.state)  # a test: its own stack
    lessons.workers.run(kit, checks)           # functions take the kit, not five loose parameters

The CLI builds one from its global options (`--platform`, `--home`, `--pg-port`, `--s3-port`, `--scheduler`) and
gives each command its own reporter (`with_reporter`): bars in a terminal, lines in a pipe, stderr under `--json`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import PLATFORMS, get_platform
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.report import Reporter
from ducklake_kit.platforms.state import State


@dataclass
class Kit:
    state: State = field(default_factory=State)
    platform_name: str = "local"
    ports: dict[str, int | None] = field(
        default_factory=dict
    )  # pg_port, s3_port (the platforms the kit runs: local, k3d, podman)
    scheduler: str | None = None  # a user's Dask scheduler (tcp://host:port); None: the kit's own worker plane
    spark_master: str | None = None  # where loads run Spark (see taxi.spark.target); None: SPARK_REMOTE or local[*]
    reporter: Reporter = field(default_factory=Reporter)
    _platform: Platform | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, reporter: Reporter | None = None) -> Kit:
        """The kit the CLI would build with no options: DUCKLAKE_PLATFORM, DUCKLAKE_HOME, DUCKLAKE_PG_PORT,
        DUCKLAKE_S3_PORT and DUCKLAKE_SCHEDULER, read the same way."""
        env = os.environ
        home = env.get("DUCKLAKE_HOME")
        return cls.build(
            env.get("DUCKLAKE_PLATFORM") or "local",
            Path(home) if home else None,
            pg_port=_port(env, "DUCKLAKE_PG_PORT"),
            s3_port=_port(env, "DUCKLAKE_S3_PORT"),
            scheduler=env.get("DUCKLAKE_SCHEDULER") or None,
            reporter=reporter,
        )

    @classmethod
    def build(
        cls,
        platform_name: str,
        home: Path | None,
        *,
        pg_port: int | None = None,
        s3_port: int | None = None,
        scheduler: str | None = None,
        reporter: Reporter | None = None,
    ) -> Kit:
        """A kit from the CLI's global options."""
        if platform_name not in PLATFORMS:
            raise KitError(f"unknown platform '{platform_name}'", f"choose one of: {', '.join(PLATFORMS)}")
        ports = {"pg_port": pg_port, "s3_port": s3_port} if platform_name in ("local", "k3d", "podman") else {}
        return cls(State(home), platform_name, ports, scheduler, reporter=reporter or Reporter())

    @classmethod
    def on(cls, platform: Platform, state: State | None = None, **settings) -> Kit:
        """A kit around a platform already made (a test's stack): `settings` are the other fields."""
        return cls(state or platform.state, platform.name, _platform=platform, **settings)

    @property
    def platform(self) -> Platform:
        if self._platform is None:
            self._platform = get_platform(self.platform_name, self.state, **self.ports)
        return self._platform

    def with_reporter(self, reporter: Reporter) -> Kit:
        return replace(self, reporter=reporter)

    def say(self, message: str) -> None:
        """One line of progress, to the reporter."""
        self.reporter.say(message)


def _port(env: os._Environ, name: str) -> int | None:
    value = env.get(name)
    if not value:
        return None
    if not value.isdigit():
        raise KitError(f"{name}={value} is not a port number", f"set {name} to a port such as 15432, or unset it")
    return int(value)
