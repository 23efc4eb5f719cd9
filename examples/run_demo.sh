#!/usr/bin/env bash
# Installs everything malletrain needs, builds it (the same build/ci as tests/run_all.sh,
# so the two share one build), then runs the local elastic demo: examples/train_digits.py
# under `malletrain local` with joins, leaves and a kill -9. Extra arguments are passed to
# train_digits.py, e.g. `bash examples/run_demo.sh --deterministic`.
set -euo pipefail

# shellcheck source=tests/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup_env.sh"
cd "${MALLE_ROOT}"

malle_setup_env
malle_build_install

# The main demo: the digits classifier (real data shipped with scikit-learn) trained by 4
# local ranks while the launcher takes two away, adds two back and kill -9s one. Every rank
# prints the membership changes it went through; rank 0 prints the loss and the result.
schedule="${MALLE_DEMO_SCHEDULE:-step=30 leave 2, step=60 join 1, step=80 join 1, step=140 kill 1}"
malle_log "Running: malletrain local --nodes 4 --schedule \"${schedule}\" -- python examples/train_digits.py $*"
exec "${MALLE_PY}" -m malletrain.cli local --nodes 4 --schedule "${schedule}" --timeout 600 -- \
  "${MALLE_PY}" examples/train_digits.py --epochs 8 --step-sleep 0.05 "$@"
