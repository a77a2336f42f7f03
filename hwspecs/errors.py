"""Errors a user can act on.

Every problem with the user's input (an unknown name, degrees that do not divide, a
malformed file) is raised as :class:`PlanError` with a one-line message naming the field
and what is allowed. The CLI prints the message on stderr and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PlanError(ValueError):
    """A user-facing error: one line, names the field and the allowed values."""


def closest_match_hint(name: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest of ``choices``, or an empty string."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{matches[0]}'?)" if matches else ""


def unknown_name_error(kind: str, name: str, choices: Iterable[str]) -> PlanError:
    """An error for a catalog name that does not exist, suggesting the closest one."""
    choices = sorted(choices)
    return PlanError(
        f"unknown {kind} '{name}'{closest_match_hint(name, choices)}; "
        f"choose one of: {', '.join(choices)} (or give a path to a file)"
    )
