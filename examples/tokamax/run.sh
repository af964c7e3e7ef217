#!/usr/bin/env bash
# tokamax checked by config alone (docs/external.md): builds the example's pinned venv
# once (setup.sh), then runs its xla and chunked_xla paths on the ci tier's fused cases.
#
#   examples/tokamax/run.sh [--records FILE]
#
# Exit status: 0 green (the known chunked_xla padding bug and the xla path's f32
# gradients are expected failures, examples/tokamax/grpo.yaml) or skipped with one line
# saying why (no Python 3.12, PyPI unreachable); 1 failing trials; 2 the run could not be
# made. scripts/nightly.sh runs it.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example.sh" tokamax --filter fused/ "$@"
