"""Platforms: where the catalog and the lake's storage run. `get_platform(name)` picks one."""

from __future__ import annotations

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus
from ducklake_kit.platforms.state import State

PLATFORMS = ("local", "k3d", "podman", "external")


def get_platform(name: str, state: State | None = None, **options) -> Platform:
    # each platform's module loads only when it is used (k3d's pulls in its tools' checks)
    if name == "local":
        from ducklake_kit.platforms.local import LocalPlatform

        return LocalPlatform(state, **options)
    if name == "external":
        from ducklake_kit.platforms.external import ExternalPlatform

        return ExternalPlatform(state)
    if name == "k3d":
        from ducklake_kit.platforms.k3d import K3dPlatform

        return K3dPlatform(state, **options)
    if name == "podman":
        from ducklake_kit.platforms.podman import PodmanPlatform

        return PodmanPlatform(state, **options)
    raise KitError(f"unknown platform '{name}'", f"choose one of: {', '.join(PLATFORMS)}")


__all__ = ["PLATFORMS", "Endpoints", "PgEndpoint", "Platform", "S3Endpoint", "ServiceStatus", "get_platform"]
