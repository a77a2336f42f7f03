"""Errors a user can act on.

Every problem with the user's input (an unknown name, degrees that do not divide, a
malformed file) is raised as :class:`PlanError` with a one-line message naming the field
and what is allowed. The CLI prints the message on stderr and exits with code 2; with
``--json`` it also prints ``{"error": {"message", "field", "allowed", "got"}}``.

:func:`validation_error` is the one place where pydantic's wording becomes ours.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class PlanError(ValueError):
    """A user-facing error: one line, names the field and the allowed values.

    ``field`` (a spec field or flag name), ``allowed`` (a description or a list of the
    allowed values) and ``got`` (the value given) are optional structured copies of what
    the message says, for ``--json``.
    """

    def __init__(self, message: str, *, field: str | None = None, allowed=None, got=None):
        super().__init__(message)
        self.field = field
        self.allowed = allowed
        self.got = got


class UnsourcedFigures(UserWarning):
    """A user's own spec file gives numbers without a source: they are used as given, and
    the CLI says which (``warning: FILE: no source for a, b``)."""

    def __init__(self, path: str, fields: Sequence[str]):
        self.path, self.fields = path, tuple(fields)
        super().__init__(
            f"{path}: no source for {', '.join(self.fields)} (used as given; cite each in "
            "[sources] to keep the file checkable)"
        )


def closest_match_hint(name: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest of ``choices``, or an empty string."""
    matches = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{matches[0]}'?)" if matches else ""


def unknown_name_error(kind: str, name: str, choices: Iterable[str]) -> PlanError:
    """An error for a catalog name that does not exist, suggesting the closest one."""
    choices = sorted(choices)
    return PlanError(
        f"unknown {kind} '{name}'{closest_match_hint(name, choices)}; "
        f"choose one of: {', '.join(choices)} (or give a path to a file)",
        field=kind,
        allowed=choices,
        got=name,
    )


def one_of(values: Sequence) -> str:
    """``"a, b or c"``: the allowed values of a field, as every message lists them."""
    values = [str(value) for value in values]
    if len(values) <= 1:
        return "".join(values)
    return f"{', '.join(values[:-1])} or {values[-1]}"


def takes_error(field: str, allowed: str, got, choices: Sequence | None = None) -> PlanError:
    """``"<field> takes <allowed>; got '<got>'"``: the one wording of a value out of bounds."""
    hint = closest_match_hint(got, [str(c) for c in choices]) if choices else ""
    return PlanError(
        f"{field} takes {allowed}; got '{got}'{hint}",
        field=field,
        allowed=list(choices) if choices else allowed,
        got=got,
    )


def bound_text(kind: str, low=None, high=None, low_open=False, high_open=False) -> str:
    """``"an integer ≥ 1"``, ``"a number in [0, 1)"``, ``"0, 1, 2 or 3"``: allowed values."""
    noun = {"int": "an integer", "float": "a number"}[kind]
    if kind == "int" and low is not None and high is not None and high - low <= 5:
        first, last = low + low_open, high - high_open
        return one_of(range(first, last + 1))
    if low is not None and high is not None:
        return f"{noun} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{noun} {'>' if low_open else '≥'} {low:g}"
    if high is not None:
        return f"{noun} {'<' if high_open else '≤'} {high:g}"
    return noun


# pydantic's error types → (our allowed-value text from the error's context).
_BOUNDS = {
    "greater_than": lambda c: f"a value > {c['gt']}",
    "greater_than_equal": lambda c: f"a value ≥ {c['ge']}",
    "less_than": lambda c: f"a value < {c['lt']}",
    "less_than_equal": lambda c: f"a value ≤ {c['le']}",
    "int_parsing": lambda c: "an integer",
    "int_type": lambda c: "an integer",
    "int_from_float": lambda c: "a whole number",
    "float_parsing": lambda c: "a number",
    "float_type": lambda c: "a number",
    "finite_number": lambda c: "a finite number",
    "bool_parsing": lambda c: "true or false",
    "bool_type": lambda c: "true or false",
    "string_type": lambda c: "text",
    "dict_type": lambda c: "a table of keys",
    "model_type": lambda c: "a table of keys",
    "model_attributes_type": lambda c: "a table of keys",
    "list_type": lambda c: "a list",
    "tuple_type": lambda c: "a list",
    "literal_error": lambda c: c.get("expected", "one of the listed values").replace("'", ""),
    "enum": lambda c: c.get("expected", "one of the listed values").replace("'", ""),
}


def validation_error(error, source: str | None = None, spec=None) -> PlanError:
    """One pydantic ``ValidationError`` as a one-line PlanError in our words.

    ``source`` names what was validated (a file path, a catalog name); the message is
    ``"<source>: <field> takes <allowed>; got '<value>'"`` for a bad value, ``"unknown
    key"`` (listing ``spec``'s keys when given) / ``"missing"`` for keys, and a validator's
    own sentence for rules.
    """
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    kind, context = first["type"], first.get("ctx") or {}
    prefix = f"{source}: " if source else ""
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    got = first.get("input")
    if kind == "extra_forbidden":
        allowed = sorted(spec.model_fields) if spec is not None and len(first["loc"]) == 1 else None
        known = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        message = f"field '{where}': unknown key{closest_match_hint(where, allowed or [])}{known}"
    elif kind == "missing":
        message, allowed = f"field '{where}': missing (required)", None
    elif kind in ("value_error", "assertion_error"):
        reason = str(context.get("error", first["msg"]))
        message, allowed, got = (f"{where}: {reason}" if where else reason), None, None
    elif kind in _BOUNDS:
        allowed = _BOUNDS[kind](context)
        shown = got if isinstance(got, (int, float, str, bool)) else type(got).__name__
        message = f"{where or 'value'} takes {allowed}; got '{shown}'"
    else:
        allowed = None
        message = f"{where or 'value'}: {first['msg'][:1].lower()}{first['msg'][1:]}"
    if not isinstance(got, (int, float, str, bool)):
        got = None
    return PlanError(
        f"{prefix}{message}{more}", field=where.split(".")[0] or None, allowed=allowed, got=got
    )
