"""llmplan's command line: a thin typer app over :mod:`planner.api`.

Each command parses its flags, calls one API function and renders the result as a rich
table or, with ``--json``, as the result's JSON. Problems with the input are one line on
stderr and exit code 2. Heavy imports (pandas, plotly, the planner) happen inside the
commands so that ``llmplan --help`` starts fast.
"""

from __future__ import annotations

import sys

import typer

from commands.common import app

# Importing the command modules registers their commands on the app, in this order.
# isort: off
from commands import plan, memory, schedule, network, validation, catalog, runs, sweep  # noqa: F401
# isort: on


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors are one line on stderr with exit code 2."""
    from hwspecs.errors import PlanError

    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="llmplan", standalone_mode=False)
    except PlanError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        sys.stderr.write("aborted\n")
        return 1
    except Exception as error:
        # Usage errors (bad option values, unknown options) from typer's click layer.
        if not hasattr(error, "format_message"):
            raise
        sys.stderr.write(f"error: {error.format_message()}\n")
        return getattr(error, "exit_code", 2) or 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
