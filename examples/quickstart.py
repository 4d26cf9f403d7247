"""Quickstart: a job, submitted to Tidal's scheduler, followed to its end.

    python examples/quickstart.py        # on a Ray cluster (`ray start`, or RAY_ADDRESS)
    tidal submit examples/quickstart.py  # the same job through the CLI
"""

from functools import partial

import tidal
from tidal.jobs.data import load_shakespeare, shakespeare_train
from tidal.jobs.models import GPTConfig, TinyGPT, lm_loss

spec = tidal.JobSpec(
    name="quickstart",
    model=partial(TinyGPT, GPTConfig(vocab_size=load_shakespeare().vocab_size, seq_len=32,
                                     d_model=64, n_layer=2)),  # a factory, called on every worker
    dataset=partial(shakespeare_train, 32),  # map-style; its items are collated into batches
    loss=lm_loss,                            # loss(model, batch) -> the micro-batch's mean loss
    global_batch=16, total_steps=60,         # samples per optimizer step, under every plan
    min_gpus=1, max_gpus=2,                  # the GPU counts the scheduler may give it
    lr=tidal.WarmupCosine(peak=3e-3, warmup=6, total=60),
)

if __name__ == "__main__":
    job = tidal.submit(spec)                     # dry-run here, then the scheduler: returns at once
    print(job.wait()["state"])
