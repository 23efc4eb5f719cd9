# Finds every third-party dependency once, as imported targets.
#   absl::*            Abseil (Debian's libabsl-dev)
#   GTest::gtest_main  GoogleTest (tests only)
#   PkgConfig::CBC     COIN-OR CBC (allocator; pkg-config cbc)
#   torch, Python      LibTorch from the installed PyPI torch (MALLE_WITH_TORCH)
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
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE MALLE_TORCH_CMAKE_PREFIX
    RESULT_VARIABLE _malle_torch_rc)
  if(NOT _malle_torch_rc EQUAL 0)
    message(FATAL_ERROR "MALLE_WITH_TORCH=ON but ${Python_EXECUTABLE} cannot import torch. "
                        "Run tests/run_all.sh (it installs the pinned torch) or pass -DPython_EXECUTABLE=.venv/bin/python.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${MALLE_TORCH_CMAKE_PREFIX})
  if(NOT MALLE_WITH_NCCL)
    # The PyPI wheel is a CUDA build; without NCCL we need none of its CUDA
    # targets, and skipping them keeps ranks from loading the CUDA libraries.
    set(CAFFE2_USE_CUDA OFF CACHE BOOL "" FORCE)
  endif()
  find_package(Torch REQUIRED)
  get_filename_component(MALLE_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
  find_library(MALLE_TORCH_CPU_LIBRARY torch_cpu PATHS ${MALLE_TORCH_LIB_DIR} REQUIRED NO_DEFAULT_PATH)
  find_library(MALLE_C10_LIBRARY c10 PATHS ${MALLE_TORCH_LIB_DIR} REQUIRED NO_DEFAULT_PATH)
  # c10d's ProcessGroupGloo.hpp includes <gloo/...>, which the wheel does not
  # ship; Debian's libgloo-dev provides the declarations (we only call
  # out-of-line members, so the headers' age does not matter for layout).
  find_path(MALLE_GLOO_INCLUDE_DIR gloo/rendezvous/store.h REQUIRED)
  # A narrow LibTorch target: c10 + torch_cpu headers and libraries, without
  # torch's CUDA interface flags. Everything outside the binding links this.
  add_library(malle_torch INTERFACE)
  target_include_directories(malle_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(malle_torch INTERFACE ${MALLE_TORCH_CPU_LIBRARY} ${MALLE_C10_LIBRARY})
  target_compile_options(malle_torch INTERFACE ${TORCH_CXX_FLAGS})
  target_compile_definitions(malle_torch INTERFACE USE_C10D_GLOO USE_DISTRIBUTED)
  message(STATUS "malletrain: LibTorch ${Torch_VERSION} from ${MALLE_TORCH_CMAKE_PREFIX}")
endif()
