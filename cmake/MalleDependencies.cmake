# Finds every third-party dependency once, as imported targets.
#   absl::*            Abseil (Debian's libabsl-dev)
#   GTest::gtest_main  GoogleTest (tests only)
#   PkgConfig::CBC     COIN-OR CBC (allocator; pkg-config cbc)
#   malle_torch        LibTorch from the installed PyPI torch (MALLE_WITH_TORCH;
#                      cmake/malleTorch.cmake), malle_torch_cuda with MALLE_WITH_NCCL
find_package(absl REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)  # gzip-compressed traces (sim/)
find_package(PkgConfig REQUIRED)
pkg_check_modules(CBC REQUIRED IMPORTED_TARGET cbc)

if(MALLE_BUILD_TESTS OR MALLE_BUILD_BENCH)
  find_package(GTest REQUIRED)
endif()

if(MALLE_WITH_TORCH)
  # LibTorch comes from the torch that is installed in the interpreter we build
  # for (the project's .venv): the extension must match it exactly.
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
endif()
# NCCL on by default where a CUDA torch, the CUDA toolkit and NCCL's header are installed:
# MALLE_WITH_NCCL becomes ON or OFF here (cmake/MalleNccl.cmake).
include(MalleNccl)
malle_nccl_configure()
if(MALLE_WITH_TORCH)
  include(malleTorch)  # shared with the installed package's malleConfig.cmake
  malle_find_torch("${Python_EXECUTABLE}" ${MALLE_WITH_NCCL})
  if(NOT Torch_FOUND)
    message(FATAL_ERROR "MALLE_WITH_TORCH=ON: ${MALLE_TORCH_ERROR}. Run tests/run_all.sh (it "
                        "installs the pinned torch) or pass -DPython_EXECUTABLE=.venv/bin/python.")
  endif()
  # c10d's ProcessGroupGloo.hpp includes <gloo/...>, which the wheel does not
  # ship; Debian's libgloo-dev provides the declarations (we only call
  # out-of-line members, so the headers' age does not matter for layout).
  find_path(MALLE_GLOO_INCLUDE_DIR gloo/rendezvous/store.h REQUIRED)
  # A narrow LibTorch target: c10 + torch_cpu headers and libraries, without
  # torch's CUDA interface flags. Everything outside the binding links this.
  # Installed as malle::torch, whose config re-points it at the consumer's torch.
  add_library(malle_torch INTERFACE)
  malle_torch_usage(malle_torch BUILD)
  if(MALLE_WITH_NCCL)
    # libtorch_cuda + libc10_cuda + CUDA::cudart, for the NCCL backend only.
    find_package(CUDAToolkit REQUIRED)
    add_library(malle_torch_cuda INTERFACE)
    malle_torch_usage(malle_torch_cuda BUILD CUDA)
  endif()
  message(STATUS "malletrain: LibTorch ${Torch_VERSION} from ${MALLE_TORCH_LIB_DIR}")
endif()
