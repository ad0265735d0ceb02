"""One-line error messages (qbench.errors)."""

from __future__ import annotations

from qbench.errors import expected_one_of


def test_expected_one_of_lists_choices_sorted_and_suggests_the_nearest() -> None:
    assert expected_one_of("labl", ["split", "label"]) == "got 'labl', expected one of label, split (did you mean 'label'?)"


def test_choices_that_would_read_as_others_are_quoted() -> None:
    """A header ' s' listed bare read as the column s; an empty name, or one holding the list's comma, vanished."""
    message = expected_one_of("s", ["f0", " s", "a,b", ""])
    assert message.startswith("got 's', expected one of ''") and "' s'" in message and "'a,b'" in message
    assert ", f0" in message and "'f0'" not in message
