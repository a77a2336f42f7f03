"""Extract the option names Megatron-LM and torchtitan accept, from their source (run by hand).

    python tests/data/extract_trainer_flags.py MEGATRON_GIT_DIR TORCHTITAN_GIT_DIR > tests/data/trainer_flags.json

Megatron-LM: every literal ``--flag`` in ``megatron/training/arguments.py`` plus the flags
its ``ArgumentGroupFactory`` derives from config dataclass fields (``field_name`` →
``--field-name``; TransformerConfig with its bases, megatron/training/config/*.py).
torchtitan: the ``section.field`` paths of ``Trainer.Config``'s ``parallelism`` and
``training`` sections (``torchtitan/config/configs.py``), which its tyro CLI accepts as
``--section.field``. Only names are read (no code is copied); the commit is recorded.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys


def _show(git_dir: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"HEAD:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _commit(git_dir: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _dataclass_fields(sources: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """class name → (annotated field names, base class names), over several modules."""
    classes = {}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                fields = [
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                ]
                bases = [base.id for base in node.bases if isinstance(base, ast.Name)]
                classes[node.name] = (fields, bases)
    return classes


def _with_bases(name: str, classes) -> list[str]:
    fields, bases = classes.get(name, ([], []))
    return fields + [field for base in bases for field in _with_bases(base, classes)]


def megatron_flags(git_dir: str) -> list[str]:
    arguments = _show(git_dir, "megatron/training/arguments.py")
    flags = set(re.findall(r"['\"](--[a-z0-9][a-z0-9-]*)['\"]", arguments))
    sources = [
        _show(git_dir, "megatron/core/model_parallel_config.py"),
        _show(git_dir, "megatron/core/transformer/transformer_config.py"),
        *(
            _show(git_dir, f"megatron/training/config/{name}.py")
            for name in ("common_config", "training_config", "resilience_config")
        ),
    ]
    classes = _dataclass_fields(sources)
    for source in sources:  # fields renamed by metadata {"arg_names": ["--flag"]}
        for names in re.findall(r"[\"']arg_names[\"']\s*:\s*\[([^\]]*)\]", source):
            flags |= set(re.findall(r"['\"](--[a-z0-9][a-z0-9-]*)['\"]", names))
    for name in set(re.findall(r"ArgumentGroupFactory\((\w+)", arguments)):
        flags |= {"--" + field.replace("_", "-") for field in _with_bases(name, classes)}
    return sorted(flags)


def torchtitan_fields(git_dir: str) -> list[str]:
    classes = _dataclass_fields([_show(git_dir, "torchtitan/config/configs.py")])
    sections = {"parallelism": "ParallelismConfig", "training": "TrainingConfig"}
    return sorted(
        f"{section}.{field}" for section, cls in sections.items() for field in classes[cls][0]
    )


if __name__ == "__main__":
    megatron, torchtitan = sys.argv[1], sys.argv[2]
    data = {
        "megatron": {
            "repo": "NVIDIA/Megatron-LM",
            "commit": _commit(megatron),
            "flags": megatron_flags(megatron),
        },
        "torchtitan": {
            "repo": "pytorch/torchtitan",
            "commit": _commit(torchtitan),
            "fields": torchtitan_fields(torchtitan),
        },
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")
