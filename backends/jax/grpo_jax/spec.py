"""The loss contract's vocabulary (see docs/spec.md): knobs, problem shapes,
dtype names, and the names/shapes/dtypes of every input and output.

Everything here is plain data; nothing traces or compiles. ``normalize_request``
turns one exporter request (a JSON object) into its canonical form, filling defaults
and rejecting malformed values with ``RequestError``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

LEVELS = ("logits", "fused")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")
IS_LEVELS = ("token", "sequence")
LOGITS_DTYPES = ("f32", "input")
PLATFORMS = ("cpu", "tpu", "cuda")
INPUT_DTYPES = ("f32", "bf16", "f16")
SHARDINGS = ("batch", "vocab")

# Dtype names used in requests and manifests.
DTYPES = {
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
    "i32": jnp.int32,
    "pred": jnp.bool_,
}


class RequestError(ValueError):
    """A malformed request (bad shape, unknown knob, out-of-range value)."""


def dtype_name(dtype: Any) -> str:
    """Name ("f32", "bf16", ...) of a numpy/jax dtype."""
    dt = np.dtype(dtype)
    for name, candidate in DTYPES.items():
        if np.dtype(candidate) == dt:
            return name
    raise ValueError(f"dtype {dt} has no name in the manifest vocabulary")


@dataclass(frozen=True)
class Knobs:
    """Loss knobs of SPEC.md. ``delta``/``max_completion_length`` None mean unset."""

    temperature: float = 1.0
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    delta: Optional[float] = None
    loss_type: str = "grpo"
    max_completion_length: Optional[int] = None
    importance_sampling_level: str = "token"
    logits_dtype: str = "f32"

    @classmethod
    def from_json(cls, obj: Optional[dict]) -> "Knobs":
        """Parse and validate a knobs object; missing keys take the defaults above."""
        obj = dict(obj or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise RequestError(f"unknown knobs: {unknown}")
        kw: dict[str, Any] = {}
        for key in ("temperature", "epsilon_low", "epsilon_high", "beta"):
            if key in obj:
                kw[key] = _number(key, obj[key])
        if obj.get("delta") is not None:
            kw["delta"] = _number("delta", obj["delta"])
        if obj.get("max_completion_length") is not None:
            mcl = obj["max_completion_length"]
            if isinstance(mcl, bool) or not isinstance(mcl, int) or mcl <= 0:
                raise RequestError(f"max_completion_length must be a positive integer, got {mcl!r}")
            kw["max_completion_length"] = mcl
        for key, allowed in (("loss_type", LOSS_TYPES),
                             ("importance_sampling_level", IS_LEVELS),
                             ("logits_dtype", LOGITS_DTYPES)):
            if key in obj:
                if obj[key] not in allowed:
                    raise RequestError(f"{key} must be one of {list(allowed)}, got {obj[key]!r}")
                kw[key] = obj[key]
        knobs = cls(**kw)
        knobs.validate()
        return knobs

    def validate(self) -> None:
        """Range checks of SPEC.md (raises RequestError)."""
        if not self.temperature > 0:
            raise RequestError(f"temperature must be > 0, got {self.temperature}")
        for key in ("epsilon_low", "epsilon_high", "beta"):
            if not getattr(self, key) >= 0:
                raise RequestError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.delta is not None and not self.delta > 1.0 + self.epsilon_high:
            raise RequestError(
                f"delta must be > 1 + epsilon_high = {1.0 + self.epsilon_high}, got {self.delta}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{key} must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise RequestError(f"{key} must be finite, got {value}")
    return value


@dataclass(frozen=True)
class Problem:
    """Shapes, dtype and target platform of one case."""

    level: str
    b: int
    t: int
    v: int
    h: Optional[int]
    dtype: str
    platform: str = "cpu"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    dtype: str  # a key of DTYPES

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def struct(self) -> "jax.ShapeDtypeStruct":  # noqa: F821
        import jax
        return jax.ShapeDtypeStruct(self.shape, DTYPES[self.dtype])


def input_specs(p: Problem) -> list[TensorSpec]:
    """All inputs in argument order (before unused ones are dropped by the export)."""
    b, t = p.b, p.t
    head = ([TensorSpec("logits", (b, t, p.v), p.dtype)] if p.level == "logits" else
            [TensorSpec("hidden", (b, t, p.h), p.dtype), TensorSpec("lm_head", (p.h, p.v), p.dtype)])
    return head + [
        TensorSpec("chosen_ids", (b, t), "i32"),
        TensorSpec("old_logp", (b, t), "f32"),
        TensorSpec("ref_logp", (b, t), "f32"),
        TensorSpec("advantages", (b,), "f32"),
        TensorSpec("mask", (b, t), "f32"),
    ]


PER_TOKEN_OUTPUTS = ("per_token_logp", "per_token_loss", "kl", "clipped", "entropy")


def output_specs(p: Problem) -> list[TensorSpec]:
    """All outputs in result order."""
    b, t = p.b, p.t
    out = [TensorSpec("loss", (), "f32")]
    out += [TensorSpec(n, (b, t), "f32") for n in PER_TOKEN_OUTPUTS]
    if p.level == "logits":
        out.append(TensorSpec("dlogits", (b, t, p.v), p.dtype))
    else:
        out += [TensorSpec("dhidden", (b, t, p.h), p.dtype), TensorSpec("dlm_head", (p.h, p.v), p.dtype)]
    return out


def _pos_int(req: dict, key: str) -> int:
    val = req.get(key)
    if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
        raise RequestError(f"{key} must be a positive integer, got {val!r}")
    return val


def normalize_request(req: Any) -> dict:
    """Canonical form of an exporter request: defaults filled, values validated.

    ``impl_options`` are passed through unchanged here; the implementation merges its
    defaults and validates them (see impls.interface.Implementation.resolve_options).
    """
    if not isinstance(req, dict):
        raise RequestError("request must be a JSON object")
    known = {"impl", "level", "b", "t", "v", "h", "dtype", "knobs", "impl_options", "platform",
             "devices", "sharding", "emulates"}
    unknown = sorted(set(req) - known)
    if unknown:
        raise RequestError(f"unknown request fields: {unknown}")
    impl = req.get("impl")
    if not isinstance(impl, str) or not impl:
        raise RequestError("impl must be a non-empty string")
    level = req.get("level", "logits")
    if level not in LEVELS:
        raise RequestError(f"level must be one of {list(LEVELS)}, got {level!r}")
    b, t, v = (_pos_int(req, k) for k in ("b", "t", "v"))
    h = _pos_int(req, "h") if level == "fused" else None
    dtype = req.get("dtype", "f32")
    if dtype not in INPUT_DTYPES:
        raise RequestError(f"dtype must be one of {list(INPUT_DTYPES)}, got {dtype!r}")
    platform = req.get("platform", "cpu")
    if platform not in PLATFORMS:
        raise RequestError(f"platform must be one of {list(PLATFORMS)}, got {platform!r}")
    emulates = req.get("emulates", "tpu") if platform == "cpu" else None
    if platform == "cpu" and emulates not in ("tpu", "gpu"):
        raise RequestError(f"emulates must be one of ['tpu', 'gpu'], got {emulates!r}")
    if platform != "cpu" and req.get("emulates") is not None:
        raise RequestError(f"emulates is for the cpu platform only, not {platform!r}")
    options = req.get("impl_options") or {}
    if not isinstance(options, dict):
        raise RequestError("impl_options must be an object")
    knobs = Knobs.from_json(req.get("knobs"))
    devices = req.get("devices", 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise RequestError(f"devices must be a positive integer, got {devices!r}")
    sharding = req.get("sharding")
    if devices > 1 and sharding not in SHARDINGS:
        raise RequestError(f"sharding must be one of {list(SHARDINGS)} with devices > 1, "
                           f"got {sharding!r}")
    if devices == 1:
        sharding = None
    out = {"impl": impl, "level": level, "b": b, "t": t, "v": v, "h": h, "dtype": dtype,
           "knobs": knobs.to_json(), "impl_options": dict(options), "platform": platform}
    if devices > 1:  # absent for one device: single-device cache keys stay as they were
        out.update(devices=devices, sharding=sharding)
    if emulates is not None:  # the accelerator a cpu export stands for (precision.py)
        out["emulates"] = emulates
    return out


def problem_of(norm: dict) -> Problem:
    """Problem of a normalized request."""
    return Problem(norm["level"], norm["b"], norm["t"], norm["v"], norm["h"], norm["dtype"],
                   norm["platform"])
