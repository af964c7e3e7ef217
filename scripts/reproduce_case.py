#!/usr/bin/env python3
"""Reproduce a case written by `grpo-suite inputs CASE --out DIR` in numpy.

Loads the inputs (cast back to the case dtype, which is exact), recomputes every SPEC
output with the project's independent float64 numpy implementation
(backends/jax/tests/oracle.py, written without reference to the Rust oracle), and
compares with the Rust oracle's outputs stored in DIR. Prints one JSON line with the
relative errors; exits 1 if any exceeds 1e-6 (both are float64 references; the stored
files are f32-rounded).

A directory that is not such a case (a missing or unreadable file, invalid JSON, a shape
or dtype other than case.json says, ids outside the vocabulary, an unknown knob value) is
one line on stderr naming the file and what is wrong, exit status 2; never a traceback.

    .venv/bin/python scripts/reproduce_case.py DIR
"""
import json
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "backends" / "jax" / "tests"))
from oracle import oracle  # noqa: E402  (the independent numpy SPEC)

# What a case.json of `grpo-suite inputs` holds (src/cli, the `inputs` command).
DTYPES = ("f32", "bf16", "f16")
LEVEL_INPUTS = {
    "logits": ("logits", "chosen_ids", "old_logp", "ref_logp", "advantages", "mask"),
    "fused": ("hidden", "lm_head", "chosen_ids", "old_logp", "ref_logp", "advantages", "mask"),
}
NUMBER_KNOBS = ("temperature", "epsilon_low", "epsilon_high", "beta")
OPTIONAL_NUMBER_KNOBS = ("delta", "max_completion_length")
CHOICE_KNOBS = {"loss_type": ("grpo", "bnpo", "dr_grpo"),
                "importance_sampling_level": ("token", "sequence"),
                "logits_dtype": ("f32", "input")}


class CaseError(Exception):
    """A malformed case directory: the message says what and where (one line)."""


def _get(obj, path: str, kind, where: pathlib.Path):
    """``obj[a][b]...`` for ``path`` = "a.b...", checked to be a ``kind``."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise CaseError(f"{where}: missing `{path}`")
        obj = obj[part]
    if not isinstance(obj, kind) or isinstance(obj, bool) and kind is not bool:
        raise CaseError(f"{where}: `{path}` is {obj!r}, not {_kind_name(kind)}")
    return obj


def _kind_name(kind) -> str:
    names = {dict: "an object", list: "a list", str: "a string", (int, float): "a number"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def read_meta(d: pathlib.Path) -> dict:
    """case.json, checked for what this script reads."""
    p = d / "case.json"
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise CaseError(f"{p}: not valid JSON (not UTF-8 at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CaseError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except OSError as e:
        raise CaseError(f"{p}: cannot read it ({e.strerror})") from None
    if not isinstance(meta, dict):
        raise CaseError(f"{p}: not a JSON object (a {type(meta).__name__})")
    _get(meta, "case.id", str, p)
    dtype = _get(meta, "case.dtype", str, p)
    if dtype not in DTYPES:
        raise CaseError(f"{p}: `case.dtype` is {dtype!r}, not one of {', '.join(DTYPES)}")
    level = _get(meta, "case.level", str, p)
    if level not in LEVEL_INPUTS:
        raise CaseError(f"{p}: `case.level` is {level!r}, not one of {', '.join(LEVEL_INPUTS)}")
    _get(meta, "case.knobs", dict, p)
    for k in NUMBER_KNOBS:
        v = _get(meta, f"case.knobs.{k}", (int, float), p)
        if not math.isfinite(v):
            raise CaseError(f"{p}: `case.knobs.{k}` is {v!r}, not a finite number")
    for k in OPTIONAL_NUMBER_KNOBS:
        v = meta["case"]["knobs"].get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise CaseError(f"{p}: `case.knobs.{k}` is {v!r}, not a number or null")
    for k, allowed in CHOICE_KNOBS.items():
        v = _get(meta, f"case.knobs.{k}", str, p)
        if v not in allowed:
            raise CaseError(f"{p}: `case.knobs.{k}` is {v!r}, not one of {', '.join(allowed)}")
    _get(meta, "inputs", dict, p)
    for name in LEVEL_INPUTS[level]:
        shape = _get(meta, f"inputs.{name}.shape", list, p)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise CaseError(f"{p}: `inputs.{name}.shape` is {shape!r}, not a list of sizes")
        _get(meta, f"inputs.{name}.dtype", str, p)
        _get(meta, f"inputs.{name}.stored_as", str, p)
    outputs = _get(meta, "oracle_outputs", list, p)
    if not all(isinstance(n, str) for n in outputs):
        raise CaseError(f"{p}: `oracle_outputs` is {outputs!r}, not a list of names")
    return meta


def load(d: pathlib.Path, name: str, shape=None, stored_as=None) -> np.ndarray:
    """``DIR/name.npy``, checked against the shape and dtype case.json gives."""
    p = d / f"{name}.npy"
    if not p.exists():
        raise CaseError(f"{p}: missing")
    if not p.is_file():
        raise CaseError(f"{p}: not a file")
    try:
        a = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        msg = " ".join(str(e).split())
        raise CaseError(f"{p}: not a readable .npy file ({msg})") from None
    if not isinstance(a, np.ndarray):
        raise CaseError(f"{p}: not a readable .npy file (an archive, not one array)")
    if shape is not None and list(a.shape) != list(shape):
        raise CaseError(f"{p}: shape {tuple(a.shape)}, case.json says {list(shape)}")
    if stored_as is not None:
        try:
            want = np.dtype(stored_as)
        except TypeError:
            raise CaseError(f"{d / 'case.json'}: `inputs.{name}.stored_as` is {stored_as!r}, "
                            "not a numpy dtype") from None
        if a.dtype != want:
            raise CaseError(f"{p}: dtype {a.dtype.str}, case.json says {stored_as}")
    return a


def main(d: pathlib.Path) -> int:
    meta = read_meta(d)
    case = meta["case"]
    dtype = {"f32": np.float32, "f16": np.float16}.get(case["dtype"])
    if dtype is None:
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    inputs = {}
    for name in LEVEL_INPUTS[case["level"]]:
        info = meta["inputs"][name]
        a = load(d, name, info["shape"], info["stored_as"])
        inputs[name] = a.astype(dtype) if info["dtype"] == case["dtype"] and name in ("logits", "hidden", "lm_head") else a
    v = inputs["logits" if case["level"] == "logits" else "lm_head"].shape[-1]
    ids = inputs["chosen_ids"]
    if ids.size and (ids.min() < 0 or ids.max() >= v):
        bad = ids[(ids < 0) | (ids >= v)].flat[0]
        raise CaseError(f"{d / 'chosen_ids.npy'}: id {bad} is outside the vocabulary [0, {v})")
    out = oracle(inputs, case["knobs"], case["level"])
    mask = inputs["mask"] != 0
    errs = {}
    for name in meta["oracle_outputs"]:
        if name not in out:
            raise CaseError(f"{d / 'case.json'}: `oracle_outputs` names {name!r}, not a SPEC "
                            f"output of the {case['level']} level")
        want = np.asarray(out[name], dtype=np.float64)
        got = load(d, name).astype(np.float64)
        if got.shape != want.shape:
            raise CaseError(f"{d / f'{name}.npy'}: shape {got.shape}, the case's {name} is {want.shape}")
        if name in ("per_token_loss", "kl", "clipped"):
            want, got = want[mask], got[mask]
        if name == "kl" and case["knobs"]["beta"] == 0:
            continue
        scale = max(np.linalg.norm(want), 1e-30)
        errs[name] = float(np.linalg.norm(got - want) / scale)
        # Tokens in the edge band may take either branch: the Rust oracle wrote the other
        # branch's gradient too; a token row agrees if it matches either file's row.
        other = d / f"{name}_other_branch.npy"
        if other.is_file() and name in ("dlogits", "dhidden"):
            alt = load(d, f"{name}_other_branch", list(want.shape)).astype(np.float64)
            band = load(d, "edge_band", list(mask.shape)) != 0
            rows = np.where(band[..., None], np.minimum(np.abs(got - want), np.abs(alt - want)),
                            np.abs(got - want))
            errs[name] = float(np.linalg.norm(rows) / scale)
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
    except CaseError as e:
        sys.exit(usage_error(f"{e}; write the directory again with `grpo-suite inputs`"))
    except Exception as e:  # noqa: BLE001 - anything else is still one line, never a traceback
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{pathlib.Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        sys.exit(usage_error(f"{d}: cannot reproduce the case ({msg} at {where}); "
                             "write the directory again with `grpo-suite inputs`"))
