#!/usr/bin/env python3
"""Reproduce a case written by `grpo-suite inputs CASE --out DIR` in numpy.

Loads the inputs (cast back to the case dtype, which is exact), recomputes every SPEC
output with the project's independent float64 numpy implementation
(backends/jax/tests/oracle.py, written without reference to the Rust oracle), and
compares with the Rust oracle's outputs stored in DIR. Prints one JSON line with the
relative errors; exits 1 if any exceeds 1e-6 (both are float64 references; the stored
files are f32-rounded).

    .venv/bin/python scripts/reproduce_case.py DIR
"""
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "backends" / "jax" / "tests"))
from oracle import oracle  # noqa: E402  (the independent numpy SPEC)


def main(d: pathlib.Path) -> int:
    meta = json.loads((d / "case.json").read_text())
    case = meta["case"]
    dtype = {"f32": np.float32, "f16": np.float16}.get(case["dtype"])
    if dtype is None:
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    inputs = {}
    for name, info in meta["inputs"].items():
        a = np.load(d / f"{name}.npy")
        inputs[name] = a.astype(dtype) if info["dtype"] == case["dtype"] and name in ("logits", "hidden", "lm_head") else a
    out = oracle(inputs, case["knobs"], case["level"])
    mask = np.load(d / "mask.npy") != 0
    errs = {}
    for name in meta["oracle_outputs"]:
        want = np.asarray(out[name], dtype=np.float64)
        got = np.load(d / f"{name}.npy").astype(np.float64)
        if name in ("per_token_loss", "kl", "clipped"):
            want, got = want[mask], got[mask]
        if name == "kl" and case["knobs"]["beta"] == 0:
            continue
        scale = max(np.linalg.norm(want), 1e-30)
        errs[name] = float(np.linalg.norm(got - want) / scale)
    print(json.dumps({"case": case["id"], "rel_err": errs}))
    return 0 if all(e <= 1e-6 for e in errs.values()) else 1


def usage_error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(usage_error("usage: reproduce_case.py DIR  (DIR from `grpo-suite inputs CASE --out DIR`)"))
    d = pathlib.Path(sys.argv[1])
    if not (d / "case.json").is_file():
        sys.exit(usage_error(f"{d} has no case.json: write one with `grpo-suite inputs CASE --out {d}`"))
    try:
        sys.exit(main(d))
    except (FileNotFoundError, KeyError, ValueError, json.JSONDecodeError) as e:
        sys.exit(usage_error(f"{d}: incomplete or unreadable case directory ({type(e).__name__}: {e}); "
                             "write it again with `grpo-suite inputs`"))
