"""The state folder: credentials generated once, private files 0600."""

from __future__ import annotations

from ducklake_kit.platforms.state import State, write_private


def test_credentials_are_generated_once_and_private(tmp_path):
    state = State(tmp_path / "home")
    assert state.credentials() is None
    first = state.credentials(create=True)
    assert state.credentials(create=True) == first  # not regenerated
    assert oct(state.credentials_file.stat().st_mode & 0o777) == "0o600"
    assert len(first.pg_password) >= 24 and first.pg_password != first.s3_secret


def test_write_private_replaces_content_with_0600(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new" and oct(path.stat().st_mode & 0o777) == "0o600"
