"""The JSON envelope every --json prints."""

from __future__ import annotations

import json

from ducklake_kit.cli.output import envelope


def test_json_envelope_shape():
    doc = json.loads(envelope("error", {"error": "x"}))
    assert doc == {"status": "error", "result": {"error": "x"}, "catalog_info": {}}
