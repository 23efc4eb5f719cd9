#!/usr/bin/env bash
# Installs everything malletrain needs, builds what the demo needs (the wheel: extension and
# daemons, not the C++ tests; in the same build/ci as tests/run_all.sh, so the two share one
# build) and installs it into .venv, then runs the main demo, examples/cluster_demo.py: the
# embedded allocator and four local node agents that appear and vanish following
# examples/demo_idle_trace.csv, with four elastic jobs (a digits classifier, a CNN and a
# hyperparameter pair) growing and shrinking in place as the allocator decides. A live
# table follows the run; at the end it prints each job's result, what happened, and the
# digits job's learned scalability, and writes out/demo/allocation.png.
# Extra arguments go to cluster_demo.py, e.g. `bash examples/run_demo.sh --policy dp`.
set -euo pipefail

# shellcheck source=tests/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup_env.sh"
cd "${MALLE_ROOT}"

malle_setup_env package
malle_build_install package

malle_log "Running: python examples/cluster_demo.py $*"
exec "${MALLE_PY}" examples/cluster_demo.py "$@"
