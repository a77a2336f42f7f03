"""Output files: checked writable before the work starts, written whole or not at all.

:func:`check_writable` runs while the flags are parsed, so ``plan --html /no/such/dir/p.html``
fails in a millisecond instead of after the search. :func:`atomic_path` hands a writer a
temporary file in the target's directory and renames it over the target only when the
writer finished (``os.replace`` is atomic on POSIX and Windows), so an interrupted run
never leaves a truncated HTML, CSV, JSON or TOML.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from hwspecs.errors import PlanError


def check_writable(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path if a file can be created there; else a PlanError naming ``flag``."""
    target = Path(path).expanduser()
    if str(path).strip() == "" or target.name in ("", ".", ".."):
        raise PlanError(
            f"{flag} takes a file path; got '{path}'",
            field=flag,
            allowed="a file path",
            got=str(path),
        )
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        problem = "is a directory"
    elif not parent.is_dir():
        problem = f"directory '{parent}' does not exist"
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = f"directory '{parent}' is not writable"
    elif target.exists() and not os.access(target, os.W_OK):
        problem = "file is not writable"
    else:
        return target
    raise PlanError(
        f"{flag} {path}: {problem}",
        field=flag,
        allowed="a file path in an existing, writable directory",
        got=str(path),
    )


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; on success rename it to ``path``."""
    target = Path(path).expanduser()
    handle, temporary = tempfile.mkstemp(  # the suffix kept: writers pick the format by it
        prefix=f".{target.stem}-partial-", suffix=target.suffix, dir=target.parent
    )
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # as open() would have created it
    try:
        yield temporary
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_pages(figure, html: str | None, png: str | None) -> None:
    """Write a plotly ``figure`` as standalone HTML (plotly.js inlined: it opens offline)
    and/or PNG, each file whole or not at all."""
    from plots.schedule import write_figure

    for path, kind in ((html, "html_path"), (png, "png_path")):
        if path:
            with atomic_path(path) as temporary:
                write_figure(figure, **{kind: temporary})


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole (temporary file + rename)."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
