"""The exporter protocol version: what the Rust side and this package agree on.

Bumped whenever a request field, a result field or a manifest field changes meaning. The
Rust side passes ``--protocol N`` to every exporter command and the exporter refuses a
different N with one line (exit status 4), so a ``grpo_jax`` installed into a user's own
environment that is older or newer than the suite is one clear error, not a confusing
failure later. Importing this module imports nothing else (the probe is cheap).
"""

PROTOCOL_VERSION = 1

# Exit status of the exporter when the protocol versions differ.
MISMATCH_EXIT = 4

# Progress lines the exporter writes on stderr (additions within protocol 1: a caller that
# ignores them loses nothing). The Rust side times each implementation from them, so a
# hang or a crash is blamed on the module that caused it, not on the exporter's start-up:
# ``READY_MARKER`` once jax and the package are imported (``--requests``), and
# ``CHECK_MARKER`` + the entry's index before each entry of ``--check-config``.
READY_MARKER = "grpo-exporter: ready"
CHECK_MARKER = "grpo-exporter: checking "
