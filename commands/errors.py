"""The CLI's error contract: one line on stderr, exit code 2, a JSON object with ``--json``.

Every user mistake ends here as a :class:`~hwspecs.errors.PlanError`: those the planner
raises, and the usage errors click finds while parsing (unknown option, bad value, missing
option), which :func:`usage_error` rewrites in the project's words with the same
``"<flag> takes <allowed>; got '<value>'"`` sentence the planner uses.
"""

from __future__ import annotations

import itertools
import json
import sys

from hwspecs.errors import PlanError, closest_match_hint, takes_error, validation_error

EXIT_USAGE = 2


def _is(error, name: str) -> bool:
    """Whether ``error`` is click's (or typer's vendored click's) exception ``name``."""
    return any(cls.__name__ == name for cls in type(error).__mro__)


def flag_of(param) -> str:
    """The flag a user types for ``param`` (its longest option, or the argument's name)."""
    if getattr(param, "param_type_name", "") == "option":
        return max(param.opts, key=len)
    return (param.name or "argument").upper()


def _allowed(command, param) -> tuple[str, list | None]:
    """What a parameter accepts, from its parser (:mod:`commands.flags`), as text and list."""
    from commands.flags import parser_of

    parser = parser_of(getattr(command, "callback", None), param.name) if command else None
    if parser is None:
        return "a value", None
    return parser.allowed, parser.choices


def _validation_cause(error):
    """The pydantic ValidationError behind a typer BadParameter, if any."""
    cause = error.__cause__ or error.__context__
    while cause is not None and not hasattr(cause, "errors"):
        cause = cause.__cause__ or cause.__context__
    return cause


def usage_error(error, command=None) -> PlanError:
    """A click usage error rewritten as a PlanError naming the flag and what it allows.

    ``command``: the command the arguments named, for errors that carry no context.
    """
    ctx = getattr(error, "ctx", None)
    command = ctx.command if ctx is not None else command
    where = ctx.command_path if ctx is not None else "llmplan"
    param = getattr(error, "param", None)
    if _is(error, "NoSuchOption"):
        options = sorted(
            opt
            for p in (command.params if command else [])
            if getattr(p, "param_type_name", "") == "option"
            for opt in (*p.opts, *p.secondary_opts)
        )
        hint = closest_match_hint(error.option_name, options)
        return PlanError(
            f"unknown option '{error.option_name}' for {where}{hint}; see '{where} --help'",
            field=error.option_name,
            allowed=options,
            got=error.option_name,
        )
    if _is(error, "MissingParameter") and param is not None:
        flag = flag_of(param)
        allowed, choices = _allowed(command, param)
        return PlanError(
            f"{where} needs {flag} ({allowed})", field=flag, allowed=choices or allowed
        )
    if _is(error, "BadParameter") and param is not None:
        flag = flag_of(param)
        cause = _validation_cause(error)
        first = cause.errors()[0] if cause is not None else {}
        planned = (first.get("ctx") or {}).get("error")
        if isinstance(planned, PlanError):  # our parsers: "takes …; got '…'"
            return PlanError(
                f"{flag} {str(planned).strip()}",
                field=flag,
                allowed=planned.allowed,
                got=planned.got,
            )
        if cause is not None:  # typer's own checks, in our words
            translated = validation_error(cause)
            return PlanError(
                f"{flag} {str(translated).split(' ', 1)[1]}",
                field=flag,
                allowed=translated.allowed,
                got=translated.got,
            )
        allowed, choices = _allowed(command, param)
        return takes_error(flag, allowed, _bad_value(error), choices)
    if _is(error, "BadOptionUsage") and getattr(error, "option_name", None):
        param = _param_named(command, error.option_name)
        allowed, choices = _allowed(command, param) if param is not None else ("a value", None)
        return PlanError(
            f"{error.option_name} needs a value ({allowed})",
            field=error.option_name,
            allowed=choices or allowed,
        )
    message = error.format_message()
    if message.startswith("No such command"):
        got = message.split("'")[1] if "'" in message else message
        names = sorted(getattr(command, "commands", {}) or {})
        return PlanError(
            f"unknown command '{got}' for {where}{closest_match_hint(got, names)}; "
            f"choose one of: {', '.join(names)}",
            field="command",
            allowed=names,
            got=got,
        )
    if message.startswith("Got unexpected extra argument"):
        got = message[message.rfind("(") + 1 : message.rfind(")")]
        return PlanError(
            f"unexpected argument '{got}' for {where} (see '{where} --help')",
            field="argument",
            got=got,
        )
    return PlanError(f"{where}: {message[:1].lower()}{message[1:].rstrip('.')}", field=None)


def _param_named(command, option: str):
    for param in command.params if command else []:
        if option in getattr(param, "opts", ()) or option in getattr(param, "secondary_opts", ()):
            return param
    return None


def _bad_value(error) -> str:
    """The value the user gave, from click's message (``"'abc' is not a valid integer."``)."""
    text = getattr(error, "message", "") or ""
    if text.startswith("'") and "'" in text[1:]:
        return text[1 : text.index("'", 1)]
    return text


def error_fields(error: PlanError, where=None, argv: list[str] | None = None) -> dict:
    """The JSON error object: message, field (a flag where one matches), allowed, got.

    ``where``: the click context or command the error happened in; a field that names one
    of its parameters (``zero_stage``) becomes that flag (``--zero-stage``).
    """
    field = error.field
    flags = _flags_by_name(getattr(where, "command", where))
    if field is not None and not str(field).startswith("-"):
        field = flags.get(str(field).replace("-", "_").replace(" ", "_"), field)
    # A field that is a flag already (an unknown option's) is kept as given.
    if field is None or (field not in flags.values() and not str(field).startswith("-")):
        field = (
            _flag_by_value(str(error), argv or [], set(flags.values()))
            or _flag_in_message(str(error), flags)
            or field
        )
    fields = {"message": str(error), "field": field}
    if error.allowed is not None:
        fields["allowed"] = error.allowed
    if error.got is not None:
        fields["got"] = error.got
    return fields


def _flags_by_name(command) -> dict[str, str]:
    params = getattr(command, "params", None) or []
    return {param.name: flag_of(param) for param in params if param.name}


def _flag_by_value(message: str, argv: list[str], flags: set[str]) -> str | None:
    """The flag whose given value (a path, a name; not a bare number) the message quotes."""
    for flag, given in itertools.pairwise(argv):
        text = given.strip()
        quoted = len(text) >= 3 and not text.replace(".", "").isdigit() and text in message
        if flag in flags and quoted:
            return flag
    return None


def _flag_in_message(message: str, flags: dict[str, str]) -> str | None:
    """The first of the command's flags a message names (``--tp`` or ``tp``), if any."""
    spaced = message.replace("=", " ").replace("·", " ").replace("/", " ")
    words = [word.strip("'\",;:()[]") for word in spaced.split()]
    for word in words:
        if word in flags.values():
            return word
        name = word.lstrip("-").replace("-", "_")
        if name in flags:
            return flags[name]
    return None


def report(error: PlanError, as_json: bool, where=None, argv: list[str] | None = None) -> int:
    """Print ``error: <message>`` on stderr (and the JSON object on stdout); return 2.

    Reasons an error carries (``error.reasons``, e.g. why no layout fits) go one a line to
    stdout, or into the JSON object.
    """
    fields = error_fields(error, where, argv)
    reasons = getattr(error, "reasons", None)
    if reasons:
        fields["reasons"] = reasons
        if not as_json:
            sys.stdout.write("".join(f"{reason}\n" for reason in reasons))
    message = " ".join(str(error).split())  # one line, whatever the message held
    if as_json:
        sys.stdout.write(json.dumps({"error": fields}, indent=2, default=str) + "\n")
    sys.stderr.write(f"error: {message}\n")
    return EXIT_USAGE
