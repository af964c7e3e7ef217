"""Run everything on the CPU backend; tests import their helpers from this directory."""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Sixteen CPU devices for the multi-device tests (test_sharded.py); set before jax loads.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=16").strip()
sys.path.insert(0, os.path.dirname(__file__))
