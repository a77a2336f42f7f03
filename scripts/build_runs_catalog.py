"""Build the project's runs catalog (hwspecs/data/runs/) from the shared reference rows.

Reads ``shared/reference/runs/train.json`` and ``targets.json`` (published runs with their
sources) and writes ``hwspecs/data/runs/train.json`` and ``targets.json`` in the schema of
:mod:`hwspecs.runs`: the facts and their ``source_ref`` as transcribed, the reference's
reading notes replaced by a short note of our own saying which values were derived or
assumed, MLA ranks moved from the free-text architecture note into ``model.mla``, and the
catalog cluster named where a row's machine is one (the targets' clusters).

Run from the repository root::

    PYTHONPATH=. python scripts/build_runs_catalog.py [--reference ../shared/reference/runs]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from hwspecs.runs import RunRow

OUT_DIR = Path(__file__).resolve().parents[1] / "hwspecs" / "data" / "runs"

#: Catalog clusters of the targets' machines (hardware.scale_out of each row says which).
TARGET_CLUSTERS = {"h100-sxm": "llama3-h100-24k", "h800-sxm": "dgx-h800"}

MLA_PATTERN = re.compile(
    r"q_lora_rank (\d+), kv_lora_rank (\d+), qk_nope (\d+), qk_rope (\d+), v_head (\d+)"
)
#: "MLA as DeepSeek-V3": the ranks of DeepSeek-V3's MLA (arXiv 2412.19437 §4.2).
DEEPSEEK_V3_MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128}  # fmt: skip


def mla_ranks(arch_notes: str | None) -> dict | None:
    """The MLA ranks an architecture note states, or None for other attention."""
    if not arch_notes or "MLA" not in arch_notes:
        return None
    found = MLA_PATTERN.search(arch_notes)
    if found is None:
        return dict(DEEPSEEK_V3_MLA) if "as DeepSeek-V3" in arch_notes else None
    q, kv, nope, rope, v = (int(x) for x in found.groups())
    return {"q_lora_rank": q, "kv_lora_rank": kv, "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope, "v_head_dim": v}  # fmt: skip


def our_note(row: dict) -> str:
    """A note in the project's words: where the row comes from and what was not printed."""
    ref = row["source_ref"]
    where = ref.get("table") or ref.get("path") or ref.get("url") or ref.get("arxiv") or ""
    parts = [f"From {ref['kind']} {ref.get('repo') or ref.get('arxiv') or ''} ({where})."]
    if row["derived_fields"]:
        parts.append(
            "Computed from other printed values: " + ", ".join(row["derived_fields"]) + "."
        )
    if row["inferred_fields"]:
        parts.append("Assumed, not printed: " + ", ".join(row["inferred_fields"]) + ".")
    if row["group"]:
        parts.append(f"Configuration group {row['group']}.")
    return " ".join(part for part in parts if part)


def converted(row: dict, cluster: str | None) -> dict:
    """One reference row in the catalog's schema (validated)."""
    out = json.loads(json.dumps(row))
    out["notes"] = our_note(row)
    out["model"]["mla"] = mla_ranks(row["model"].get("arch_notes"))
    out["hardware"]["cluster"] = cluster
    return RunRow.model_validate(out).model_dump(mode="json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "reference" / "runs"
    parser.add_argument("--reference", type=Path, default=default)
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in ("train", "targets"):
        rows = json.loads((args.reference / f"{name}.json").read_text())
        clusters = TARGET_CLUSTERS if name == "targets" else {}
        out = [converted(r, clusters.get(r["hardware"]["accelerator"])) for r in rows]
        (OUT_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {len(out)} rows")


if __name__ == "__main__":
    main()
