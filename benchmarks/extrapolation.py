"""What a profile's error becomes beyond the layouts it was fitted on, measured on the runs.

For each accelerator with enough runs, the rows are split at a degree (tp ≤ 4 against tp 8,
pp ≤ 4 against deeper, cp 1 against cp > 1, ep ≤ 8 against more, ≤ 256 GPUs against more);
the whole profile fit (``llmplan fit``'s procedure, term selection included) runs on the
rows inside, and the rows beyond are predicted by it ("extrapolated"). Beside it, the same
rows held out by source from the fit on every row ("interpolated": the fit had seen
layouts like theirs). The gap is what extrapolating along that axis cost on the runs that
exist, the evidence behind the ranking's rule 0 (``planner/rank.py``) and the plans'
``outside_measured_layouts``. Nothing here is fitted on the test targets.

Run: ``python benchmarks/extrapolation.py [accelerator …]`` (default h100-sxm and gb200;
about half a minute on 2 cores). Prints Markdown.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install

DEFAULT_ACCELERATORS = ("h100-sxm", "gb200")


def main(accelerators: list[str]) -> None:
    from planner import api

    print("| accelerator | split | rows inside | rows beyond (sources) | extrapolated MAPE "
          "| median error | interpolated MAPE | terms fitted inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for accelerator in accelerators:
        for found in api.extrapolation(accelerator):
            print(
                f"| {accelerator} | {found.description} | {found.num_inside} | "
                f"{found.num_beyond} ({found.sources_beyond}) | {found.extrapolated_mape:.1%} | "
                f"{found.extrapolated_median_error:+.1%} | {found.interpolated_mape:.1%} | "
                f"{', '.join(found.fitted_terms_inside)} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_ACCELERATORS))
