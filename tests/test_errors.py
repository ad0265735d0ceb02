"""One-line error messages (qbench.errors)."""

from __future__ import annotations

import errno

import pytest

from qbench.errors import QbenchError, environment_cause, expected_one_of


def test_expected_one_of_lists_choices_sorted_and_suggests_the_nearest() -> None:
    assert expected_one_of("labl", ["split", "label"]) == "got 'labl', expected one of label, split (did you mean 'label'?)"


def test_choices_that_would_read_as_others_are_quoted() -> None:
    """A header ' s' listed bare read as the column s; an empty name, or one holding the list's comma, vanished."""
    message = expected_one_of("s", ["f0", " s", "a,b", ""])
    assert message.startswith("got 's', expected one of ''") and "' s'" in message and "'a,b'" in message
    assert ", f0" in message and "'f0'" not in message


def _raised_from(cause: BaseException, *, hide: bool = False) -> QbenchError:
    try:
        try:
            raise cause
        except BaseException:
            if hide:
                raise QbenchError("the variant failed") from None
            raise QbenchError("cannot write to the run folder") from cause
    except QbenchError as exc:
        return exc


@pytest.mark.parametrize(("exc", "cause"), [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    (MemoryError(), "out of memory"),
    (TimeoutError("timed out"), "a timeout"),
    (ConnectionResetError("reset"), "a lost connection"),
    (FileNotFoundError(errno.ENOENT, "No such file"), None),
    (ValueError("bad graph"), None),
])  # fmt: skip
def test_a_failure_of_the_machine_is_told_from_the_variants_own_along_the_chain_of_causes(
    exc: BaseException, cause: str | None
) -> None:
    assert environment_cause(exc) == cause
    assert environment_cause(_raised_from(exc)) == cause
    assert environment_cause(_raised_from(exc, hide=True)) is None  # `from None`: not its cause
