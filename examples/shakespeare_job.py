"""A reconfigurable job: the tiny GPT on Shakespeare.

    tidal plan examples/shakespeare_job.py --gpus 2     # rank its plans on 2 GPUs
"""

from __future__ import annotations

from tidal import WarmupCosine
from tidal.jobs.reference import shakespeare_gpt


def make_spec():  # type: ignore[no-untyped-def]
    return shakespeare_gpt(name="shakespeare-gpt", global_batch=32, total_steps=300, min_gpus=1,
                           max_gpus=4, lr=WarmupCosine(peak=3e-3, warmup=30, total=300))
