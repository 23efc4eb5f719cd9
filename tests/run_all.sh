#!/usr/bin/env bash
# Installs everything malletrain needs (Debian packages, .venv with the pinned torch),
# builds the package and the C++ tests in one CMake build (build/ci) and makes the wheel
# self-contained (build/dist, installed into .venv), then runs ctest and pytest: tests/python,
# and tests/packaging (that wheel in a new venv outside the tree; the C++ package installed
# and used by projects outside the tree). Runs both suites even if the first fails; exits
# non-zero if either failed.
# Works from any directory; on a fresh Debian 12 machine it needs root (or sudo).
set -euo pipefail

# shellcheck source=tests/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "${MALLE_ROOT}"

start=${SECONDS}
malle_setup_env
malle_build_install
build_s=$((SECONDS - start))

malle_log "C++ tests (ctest)"
t0=${SECONDS}
ctest_rc=0
ctest --test-dir "${MALLE_BUILD_DIR}" --output-on-failure --timeout 600 -j2 --no-tests=error \
  || ctest_rc=$?
ctest_s=$((SECONDS - t0))

malle_log "Python tests (pytest)"
t0=${SECONDS}
pytest_rc=0
# Exit status 5 (no tests collected) is a failure too: it is not 0.
"${MALLE_PY}" -m pytest tests/python tests/packaging -q --durations=20 || pytest_rc=$?
pytest_s=$((SECONDS - t0))

verdict() { if (($1 == 0)); then echo "passed"; else echo "FAILED (exit $1)"; fi; }
echo
echo "==================== summary ===================="
printf '  setup + build : %4ds\n' "${build_s}"
printf '  ctest         : %4ds  %s\n' "${ctest_s}" "$(verdict "${ctest_rc}")"
printf '  pytest        : %4ds  %s\n' "${pytest_s}" "$(verdict "${pytest_rc}")"
echo "================================================="
if ((ctest_rc != 0 || pytest_rc != 0)); then
  exit 1
fi
