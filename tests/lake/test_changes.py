"""The one reading of a snapshot's `changes_made`, shared by the step runner's retries and the dynamic tables' feed."""

from ducklake_kit.lake.changes import split_changes


def test_changes_made_splits_at_the_commas_between_changes_not_inside_quoted_names():
    made = 'created_table:"main"."a,b",inserted_into_table:5,inlined_delete:7,created_schema:"x,y"'
    assert split_changes(made) == [
        'created_table:"main"."a,b"',
        "inserted_into_table:5",
        "inlined_delete:7",
        'created_schema:"x,y"',
    ]
    assert split_changes(None) == [] and split_changes("") == []
