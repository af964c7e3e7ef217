"""A stand-alone example of kernels living outside grpo-conformance (docs/external.md)."""
