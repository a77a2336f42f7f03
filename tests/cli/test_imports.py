"""A plan that writes no table imports no pandas (issue 20: ``import pandas`` is about 0.3 s
of the default plan's 0.8 s budget); only ``--csv``, ``--html`` and ``--png`` build the
DataFrame."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLANS_THEN_MODULES = """
import sys
import cli
for argv in (["plan", "--explain"], ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                     "--gpus", "64", "--json"]):
    assert cli.main(argv) == 0, argv
print(sorted(name for name in sys.modules if name.split(".")[0] == "pandas"), file=sys.stderr)
"""


def test_a_plan_without_a_table_output_imports_no_pandas():
    """The default plan (printed, with --explain) and a plan in JSON, in a fresh interpreter
    (other tests' imports do not leak in)."""
    done = subprocess.run(
        [sys.executable, "-c", PLANS_THEN_MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "chose" in done.stdout and '"results"' in done.stdout  # both plans printed
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
