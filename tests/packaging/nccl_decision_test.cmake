# The NCCL decision (cmake/MalleNccl.cmake: malle_nccl_decide) on faked inputs, in CMake's
# script mode: cmake -P tests/packaging/nccl_decision_test.cmake (run by test_nccl_decision.py).
# Prints one line per case and fails (exit 1) on the first case that decides otherwise.
cmake_minimum_required(VERSION 3.22)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/MalleNccl.cmake")

set(cases 0)
# expect_decision(<ON|OFF|ERROR> <substring of the reason> <malle_nccl_decide's arguments>...)
function(expect_decision want reason_part)
  malle_nccl_decide(got why ${ARGN})
  string(FIND "${why}" "${reason_part}" at)
  if(NOT got STREQUAL want OR at EQUAL -1)
    message(FATAL_ERROR "case [${ARGN}]: got ${got} (${why}); want ${want} with '${reason_part}'")
  endif()
  message(STATUS "ok: ${got} (${why})")
  math(EXPR n "${cases} + 1")
  set(cases ${n} PARENT_SCOPE)
endfunction()

set(cuda_all WITH_TORCH ON TORCH_VERSION 2.11.0+cu130 TORCH_CUDA 13.0 TOOLKIT 13.0.88
             NCCL_INCLUDE /venv/site-packages/nvidia/nccl/include)
set(cpu_torch WITH_TORCH ON TORCH_VERSION 2.11.0+cpu TORCH_CUDA "" TOOLKIT 13.0.88 NCCL_INCLUDE "")

# Everything installed (this project's machines): on by default, and when asked for.
expect_decision(ON "AUTO: torch 2.11.0+cu130 with CUDA 13.0, CUDA toolkit 13.0.88" REQUEST AUTO ${cuda_all})
expect_decision(ON "ON: torch" REQUEST ON ${cuda_all})
expect_decision(ON "ON: torch" REQUEST TRUE ${cuda_all})  # an old cache's BOOL
expect_decision(OFF "MALLE_WITH_NCCL=OFF" REQUEST OFF ${cuda_all})
expect_decision(OFF "MALLE_WITH_NCCL=OFF" REQUEST 0 ${cuda_all})
expect_decision(ON "AUTO" REQUEST auto ${cuda_all})
# A CPU torch builds without CUDA, even with a toolkit on the machine; asked for, an error.
expect_decision(OFF "torch 2.11.0+cpu is a CPU build" REQUEST AUTO ${cpu_torch})
expect_decision(OFF "Gloo only" REQUEST AUTO ${cpu_torch})
expect_decision(ERROR "MALLE_WITH_NCCL=ON, but torch 2.11.0+cpu is a CPU build" REQUEST ON ${cpu_torch})
# A CUDA torch without the toolkit (a laptop with the PyPI wheel), or without NCCL's header.
expect_decision(OFF "no CUDA toolkit found" REQUEST AUTO WITH_TORCH ON TORCH_VERSION 2.11.0
                TORCH_CUDA 13.0 TOOLKIT "" NCCL_INCLUDE /x)
expect_decision(ERROR "but no CUDA toolkit found" REQUEST ON WITH_TORCH ON TORCH_VERSION 2.11.0
                TORCH_CUDA 13.0 TOOLKIT "" NCCL_INCLUDE /x)
expect_decision(OFF "no nccl.h beside torch" REQUEST AUTO WITH_TORCH ON TORCH_VERSION 2.11.0
                TORCH_CUDA 13.0 TOOLKIT 13.0.88 NCCL_INCLUDE "")
# A toolkit of another major version than torch's CUDA: its cudart must not meet torch's.
expect_decision(OFF "the CUDA toolkit 12.4.1 does not match torch's CUDA 13.0" REQUEST AUTO
                WITH_TORCH ON TORCH_VERSION 2.11.0 TORCH_CUDA 13.0 TOOLKIT 12.4.1 NCCL_INCLUDE /x)
expect_decision(ON "CUDA toolkit 13.1.0" REQUEST AUTO WITH_TORCH ON TORCH_VERSION 2.11.0
                TORCH_CUDA 13.0 TOOLKIT 13.1.0 NCCL_INCLUDE /x)
# No LibTorch modules: nothing to build NCCL into, whatever was asked.
expect_decision(OFF "MALLE_WITH_TORCH=OFF" REQUEST AUTO WITH_TORCH OFF TORCH_VERSION ""
                TORCH_CUDA "" TOOLKIT "" NCCL_INCLUDE "")
expect_decision(OFF "MALLE_WITH_TORCH=OFF" REQUEST ON WITH_TORCH OFF TORCH_VERSION ""
                TORCH_CUDA "" TOOLKIT 13.0 NCCL_INCLUDE "")
# A request that is none of AUTO/ON/OFF.
expect_decision(ERROR "MALLE_WITH_NCCL must be AUTO, ON or OFF, got 'maybe'" REQUEST maybe ${cuda_all})

message(STATUS "nccl decision: ${cases} cases passed")
