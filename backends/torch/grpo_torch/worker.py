"""The suite's torch worker: ``python -m grpo_torch.worker --protocol N``.

It answers one JSON line on stdout per request line on stdin. A request names the
implementation, the case (level, shapes, dtype, knobs), the device, the warm-up and timed
runs, and a directory holding the inputs as .npy files (binary: no text encoding); the
worker writes the outputs there as ``out_<name>.npy`` (f32) and answers
``{"status": "ok", "outputs": [...], "not_provided": [...], "runs_s": [...],
"peak_bytes": N or null, "argument_bytes": N, "output_bytes": N}`` (the allocator's peak
on cuda, and the bytes of the inputs and outputs as the implementation holds them), or ``{"status": "unsupported" | "not_applicable", "reason":
...}``, or ``{"status": "error", "message": one line}``. Its first line is
``{"status": "ready", ...}`` once torch is imported. A request with ``"check": true``
answers only whether the implementation runs the case (the backend's support check). The suite supervises it: a crash or a
hang costs the trial it was on, and the next trial starts a new worker.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

PROTOCOL_VERSION = 1
HEAD = {"logits": ("logits",), "fused": ("hidden", "lm_head")}
BATCH = ("chosen_ids", "old_logp", "ref_logp", "advantages", "mask")


def _one_line(e: BaseException) -> str:
    """The exception and where in the implementation's code it was raised."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "grpo_torch/worker.py" not in f.filename.replace(os.sep, "/")]
    at = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}{at}"


def resolve(impl_id: str):
    """The implementation of ``impl_id``: a shipped id, or ``module:ATTR``."""
    from .impls import IMPLEMENTATIONS
    from .interface import Implementation
    if impl_id in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[impl_id]
    if ":" not in impl_id:
        raise LookupError(f"no torch implementation `{impl_id}`: grpo_torch ships "
                          f"{', '.join(sorted(IMPLEMENTATIONS))}; an external one is `module:ATTR`")
    module, attr = impl_id.split(":", 1)
    obj = getattr(importlib.import_module(module), attr)
    if not isinstance(obj, Implementation):
        raise TypeError(f"`{impl_id}` is a {type(obj).__name__}, not a grpo_torch Implementation")
    return obj


def _refusal(why: str) -> dict:
    """An implementation's reason not to run a case, as an answer."""
    if why.startswith("not applicable: "):
        return {"status": "not_applicable", "reason": why[len("not applicable: "):]}
    if why.startswith("error: "):
        return {"status": "error", "message": why[len("error: "):]}
    return {"status": "unsupported", "reason": why}


def _problem(req: dict):
    from .interface import Problem
    return Problem(level=req["level"], b=req["b"], t=req["t"], v=req["v"], h=req.get("h"),
                   dtype=req["dtype"], device=req.get("device", "cpu").split(":")[0])


def check(req: dict) -> dict:
    """Whether an implementation runs a case (its level, dtype and ``supports``), without
    its inputs: the backend's support check."""
    impl = resolve(req["impl"])
    why = impl.unsupported(_problem(req), req["knobs"], req.get("options") or {})
    return {"status": "ok"} if why is None else _refusal(why)


def run(req: dict) -> dict:
    """One request's answer (the outputs written into ``req["dir"]``)."""
    import numpy as np
    import torch
    from .interface import METRICS

    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    device = torch.device(req.get("device", "cpu"))
    problem = _problem(req)
    knobs = req["knobs"]
    options = req.get("options") or {}
    impl = resolve(req["impl"])
    why = impl.unsupported(problem, knobs, options)
    if why is not None:
        return _refusal(why)
    options = {**impl.default_options, **options}
    d = req["dir"]
    load = lambda n: np.load(os.path.join(d, f"{n}.npy"))  # noqa: E731
    head_np = {n: load(n) for n in HEAD[problem.level]}
    batch = {n: torch.from_numpy(load(n)).to(device) for n in BATCH}
    batch["chosen_ids"] = batch["chosen_ids"].long()
    dt = dtypes[problem.dtype]
    head0 = {n: torch.from_numpy(a).to(dtype=dt) for n, a in head_np.items()}
    cuda = device.type == "cuda"
    # The arguments are the batch and one fresh upload of the head per run (a kernel may
    # write into its inputs, as Liger's Triton kernels do); the previous run's results are
    # dropped first, so the allocator's peak holds no copy of ours: the floor is arguments
    # + outputs.
    argument_bytes = sum(x.numel() * x.element_size() for x in (*head0.values(), *batch.values()))
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    runs_s, result = [], None
    for i in range(req.get("warmup", 1) + req.get("repeats", 3)):
        result = head = None
        head = {n: x.to(device, copy=True).requires_grad_(True) for n, x in head0.items()}
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        loss, metrics = impl.loss(head, batch, knobs, options)
        loss.backward()
        if cuda:
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            elapsed = time.perf_counter() - t0
        if i >= req.get("warmup", 1):
            runs_s.append(elapsed)
        result = (loss, metrics, head)
    loss, metrics, head = result
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        return {"status": "error", "message": f"{impl.name} returned metrics {unknown}, "
                f"which are not SPEC outputs ({', '.join(METRICS)})"}
    outs = {"loss": loss.detach().reshape(())}
    outs.update({n: m.detach() for n, m in metrics.items()})
    for n, x in head.items():
        if x.grad is None:
            return {"status": "error", "message": f"{impl.name}: the loss does not depend on `{n}` (no gradient)"}
        if x.grad.dtype != x.dtype:
            return {"status": "error", "message": f"{impl.name}: d{n} is {x.grad.dtype}, its input {x.dtype}"}
        outs["d" + n] = x.grad
    peak = int(torch.cuda.max_memory_allocated(device)) if cuda else None
    output_bytes = sum(x.numel() * x.element_size() for x in outs.values())
    for n, x in outs.items():
        np.save(os.path.join(d, f"out_{n}.npy"), x.to("cpu", torch.float32).numpy())
    return {"status": "ok", "outputs": sorted(outs),
            "not_provided": [m for m in METRICS if m not in metrics],
            "runs_s": runs_s,
            "peak_bytes": peak,
            "argument_bytes": argument_bytes,
            "output_bytes": output_bytes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo_torch.worker")
    p.add_argument("--protocol", type=int, required=True)
    args = p.parse_args(argv)
    if args.protocol != PROTOCOL_VERSION:
        print(f"grpo_torch speaks worker protocol {PROTOCOL_VERSION}, the suite {args.protocol}: "
              f"install this checkout's backends/torch", file=sys.stderr)
        return 4
    out = sys.stdout
    sys.stdout = sys.stderr  # an implementation's prints must not reach the protocol
    import torch
    print(json.dumps({"status": "ready", "torch": torch.__version__,
                      "python": sys.executable, "cuda": torch.cuda.is_available()}),
          file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            answer = check(req) if req.get("check") else run(req)
        except Exception as e:  # one line, and the worker goes on
            answer = {"status": "error", "message": _one_line(e)}
        print(json.dumps(answer), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
