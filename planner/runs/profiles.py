"""Which efficiency profile a job on an accelerator takes.

An accelerator with a shipped profile (``hwspecs/data/profiles/<accelerator>.toml``, or
``<accelerator>.<stack>.toml`` fitted on one software stack's runs) takes its own; one
without runs takes the nearest generation's and says so (``EfficiencyProfile.
borrowed_from``); ``none`` is the ideal model and a path a user's own. ``auto`` (the
command line's default) is the shipped one for the job's accelerator and stack.
"""

from __future__ import annotations

from hwspecs.catalog import load_profile, profile_names

#: The accelerator whose profile one without runs of its own takes: the same chip
#: generation (H800 and H200 are H100 silicon with other NVLink / HBM; B200 and GB200 one
#: Blackwell die pair, B300 and GB300 one Blackwell Ultra; the two A100 memory sizes one chip).
NEAREST_GENERATION = {
    "h800-sxm": "h100-sxm",
    "h200-sxm": "h100-sxm",
    "h100-pcie": "h100-sxm",
    "a100-sxm-40gb": "a100-sxm-80gb",
    "a100-sxm-80gb": "a100-sxm-40gb",
    "b200": "gb200",
    "gb200": "b200",
    "b300": "gb300",
    "gb300": "b300",
    "tpu-v5e": "tpu-v5p",
    "tpu-v4": "tpu-v5p",
    "tpu-v6e": "tpu-v5p",
}


#: Software stacks a job names (``--stack``): the families the shipped profiles are fitted
#: per (:func:`planner.runs.rows.stack_label` puts each published run in one).
STACKS = ("megatron", "pytorch-fsdp", "jax", "deepspeed")
#: ``--profile`` values that are not a name or path: the shipped profile, the ideal model.
PROFILE_CHOICES = ("auto", "none")


def profile_for(accelerator: str, choice: str | None = None, stack: str | None = None):
    """The profile a job on ``accelerator`` uses: ``choice`` ``none`` gives None (ideal),
    a name or path that profile, None the shipped one — the accelerator's for ``stack``
    (``<accelerator>.<stack>``), else its all-stack one, else the nearest generation's
    (marked ``borrowed_from``), else None."""
    if choice == "none":
        return None
    if choice is not None:  # a path, or a shipped profile's name
        return load_profile(choice)
    shipped = profile_names()
    for name in (accelerator, NEAREST_GENERATION.get(accelerator)):
        for candidate in ((f"{name}.{stack}",) if stack else ()) + (name,):
            if candidate in shipped:
                profile = load_profile(candidate)
                if name != accelerator:
                    profile = profile.model_copy(update={"borrowed_from": candidate})
                return profile
    return None
