"""PyTorch GRPO loss implementations judged by the suite (docs/backends.md, "torch").

``contract`` is SPEC's loss in plain torch, ``impls`` the implementations the suite ships
(``torch_baseline``), ``interface`` what an implementation provides, and ``worker`` the
process the suite's `torch` backend talks to (one JSON line per trial, tensors as .npy).
"""
