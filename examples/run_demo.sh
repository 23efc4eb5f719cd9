#!/usr/bin/env bash
# Installs everything malletrain needs, builds it (the same build/ci as tests/run_all.sh,
# so the two share one build), then runs the local elastic demo. Extra arguments are
# passed to the demo program, e.g. `bash examples/run_demo.sh --help`.
set -euo pipefail

# shellcheck source=tests/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup_env.sh"
cd "${MALLE_ROOT}"

malle_setup_env
malle_build_install

demo="${MALLE_BUILD_DIR}/examples/elastic_group_demo"
if [[ ! -x "${demo}" ]]; then
  echo "error: ${demo} was not built (see build/ci-build.log)" >&2
  exit 1
fi
malle_log "Running ${demo} $*"
exec "${demo}" "$@"
