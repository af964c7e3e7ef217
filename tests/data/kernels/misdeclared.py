"""A deliberately wrong test variant, checked through config alone (``id:
misdeclared:IMPLEMENTATION``, ``pythonpath: [tests/data/kernels]``): ``pallas_logits`` whose
forward kernel declares half the HBM bytes it moves in its ``pl.CostEstimate``. The
suite derives the bytes from the kernel itself, so the tpu-aot trial must fail naming
both figures (``tests/tpu_aot.rs``)."""

import dataclasses

from grpo_jax.impls import pallas_logits

IMPLEMENTATION = dataclasses.replace(
    pallas_logits.IMPLEMENTATION,
    id="pallas_logits_halfbytes",
    description="pallas_logits declaring half its forward kernel's bytes (test variant)",
    build=pallas_logits._builder(None, declared_bytes_scale=0.5),
    per_token=pallas_logits._per_token_builder(None, declared_bytes_scale=0.5),
)
