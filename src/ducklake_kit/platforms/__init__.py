"""Platforms: where the catalog and the lake's storage run. `get_platform(name)` picks one."""

from __future__ import annotations

from ..errors import KitError
from ..state import State
from .base import Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus

PLATFORMS = ("local", "k3d", "external")


def get_platform(name: str, state: State | None = None, **options) -> Platform:
    if name == "local":
        from .local import LocalPlatform

        return LocalPlatform(state, **options)
    if name == "external":
        from .external import ExternalPlatform

        return ExternalPlatform(state)
    if name == "k3d":
        from .k3d import K3dPlatform

        return K3dPlatform(state, **options)
    raise KitError(f"unknown platform '{name}'", f"choose one of: {', '.join(PLATFORMS)}")


__all__ = ["Endpoints", "PgEndpoint", "Platform", "S3Endpoint", "ServiceStatus", "PLATFORMS", "get_platform"]
