# Whether libmalle builds its NCCL backend: one decision, a function of what is installed, so
# that every way of building (pip install ., tests/setup_env.sh, a plain CMake configure) agrees.
#
#   malle_nccl_decide(<out_var> <reason_var>
#                     REQUEST <AUTO|ON|OFF> WITH_TORCH <bool> TORCH_VERSION <v>
#                     TORCH_CUDA <torch.version.cuda, "" for a CPU build>
#                     TOOLKIT <CUDA toolkit version, "" when none> NCCL_INCLUDE <dir, "" when none>)
#       Pure (no probing, usable in cmake -P): sets <out_var> to ON, OFF or ERROR and
#       <reason_var> to why. AUTO is ON exactly when a CUDA torch, a CUDA toolkit of the same
#       major version and NCCL's header are all present; ON with something missing is ERROR
#       (naming it); OFF, or MALLE_WITH_TORCH off, is OFF.
#   malle_nccl_probe(<python>)
#       Probes what malle_nccl_decide takes: <python>'s torch (version, torch.version.cuda, the
#       nvidia-nccl headers beside it), find_package(CUDAToolkit QUIET). Sets
#       MALLE_NCCL_PROBE_{TORCH_VERSION,TORCH_CUDA,TOOLKIT} and MALLE_NCCL_INCLUDE_DIR (cache;
#       -NOTFOUND when absent).
#   malle_nccl_configure()
#       The build's use of both: probes (with MALLE_WITH_TORCH), decides from the cache
#       variable MALLE_WITH_NCCL (the request), reports the decision in the configure output,
#       stops on ERROR, and sets the normal variable MALLE_WITH_NCCL to ON or OFF (what every
#       `if(MALLE_WITH_NCCL)` of the build reads) and the cache entry MALLE_NCCL_ENABLED.
#
# tests/packaging/nccl_decision_test.cmake checks the decision with faked inputs.

function(malle_nccl_decide out_var reason_var)
  cmake_parse_arguments(PARSE_ARGV 2 A "" "REQUEST;WITH_TORCH;TORCH_VERSION;TORCH_CUDA;TOOLKIT;NCCL_INCLUDE" "")
  string(TOUPPER "${A_REQUEST}" request)
  if(request MATCHES "^(1|TRUE|YES|Y)$")
    set(request ON)
  elseif(request MATCHES "^(0|FALSE|NO|N)$")
    set(request OFF)
  endif()
  if(NOT request MATCHES "^(AUTO|ON|OFF)$")
    set(${out_var} ERROR PARENT_SCOPE)
    set(${reason_var} "MALLE_WITH_NCCL must be AUTO, ON or OFF, got '${A_REQUEST}'" PARENT_SCOPE)
    return()
  endif()
  if(request STREQUAL "OFF")
    set(${out_var} OFF PARENT_SCOPE)
    set(${reason_var} "MALLE_WITH_NCCL=OFF" PARENT_SCOPE)
    return()
  endif()
  if(NOT A_WITH_TORCH)
    # The NCCL backend is one of the LibTorch modules: nothing to build it into.
    set(${out_var} OFF PARENT_SCOPE)
    set(${reason_var} "MALLE_WITH_TORCH=OFF: no LibTorch modules" PARENT_SCOPE)
    return()
  endif()
  set(missing "")  # what is missing, in the order a user would install it
  if("${A_TORCH_CUDA}" STREQUAL "")
    list(APPEND missing "torch ${A_TORCH_VERSION} is a CPU build (torch.version.cuda is None)")
  endif()
  if("${A_TOOLKIT}" STREQUAL "")
    list(APPEND missing "no CUDA toolkit found (CUDAToolkit_ROOT, nvcc on PATH, /usr/local/cuda)")
  elseif(NOT "${A_TORCH_CUDA}" STREQUAL "")
    string(REGEX MATCH "^[0-9]+" toolkit_major "${A_TOOLKIT}")
    string(REGEX MATCH "^[0-9]+" torch_major "${A_TORCH_CUDA}")
    if(NOT "${toolkit_major}" STREQUAL "${torch_major}")
      list(APPEND missing "the CUDA toolkit ${A_TOOLKIT} does not match torch's CUDA ${A_TORCH_CUDA}")
    endif()
  endif()
  if("${A_NCCL_INCLUDE}" STREQUAL "")
    list(APPEND missing "no nccl.h beside torch (the nvidia-nccl package of a CUDA torch)")
  endif()
  if("${missing}" STREQUAL "")
    set(${out_var} ON PARENT_SCOPE)
    set(${reason_var} "${request}: torch ${A_TORCH_VERSION} with CUDA ${A_TORCH_CUDA}, CUDA toolkit ${A_TOOLKIT}, nccl.h in ${A_NCCL_INCLUDE}" PARENT_SCOPE)
    return()
  endif()
  list(JOIN missing "; " missing_text)
  if(request STREQUAL "ON")
    set(${out_var} ERROR PARENT_SCOPE)
    set(${reason_var} "MALLE_WITH_NCCL=ON, but ${missing_text}" PARENT_SCOPE)
  else()
    set(${out_var} OFF PARENT_SCOPE)
    set(${reason_var} "AUTO: ${missing_text}; Gloo only" PARENT_SCOPE)
  endif()
endfunction()

macro(malle_nccl_probe _malle_python)
  set(MALLE_NCCL_PROBE_TORCH_VERSION "")
  set(MALLE_NCCL_PROBE_TORCH_CUDA "")
  set(MALLE_NCCL_PROBE_TOOLKIT "")
  execute_process(
    COMMAND "${_malle_python}" -c
            "import os, torch; print(torch.__version__, torch.version.cuda or '-', os.path.dirname(torch.__file__), sep=';', end='')"
    OUTPUT_VARIABLE _malle_nccl_out
    RESULT_VARIABLE _malle_nccl_rc
    ERROR_QUIET)
  if(_malle_nccl_rc EQUAL 0)
    list(GET _malle_nccl_out 0 MALLE_NCCL_PROBE_TORCH_VERSION)
    list(GET _malle_nccl_out 1 MALLE_NCCL_PROBE_TORCH_CUDA)
    list(GET _malle_nccl_out 2 _malle_nccl_torch_dir)
    if(MALLE_NCCL_PROBE_TORCH_CUDA STREQUAL "-")
      set(MALLE_NCCL_PROBE_TORCH_CUDA "")
    endif()
    # The wheel's own NCCL headers (nvidia-nccl), matching the library torch uses.
    find_path(MALLE_NCCL_INCLUDE_DIR nccl.h PATHS "${_malle_nccl_torch_dir}/../nvidia/nccl/include"
              NO_DEFAULT_PATH)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(MALLE_NCCL_PROBE_TOOLKIT "${CUDAToolkit_VERSION}")
  endif()
endmacro()

macro(malle_nccl_configure)
  set(_malle_nccl_include "")
  if(MALLE_WITH_TORCH)
    malle_nccl_probe("${Python_EXECUTABLE}")
    if(MALLE_NCCL_INCLUDE_DIR)
      set(_malle_nccl_include "${MALLE_NCCL_INCLUDE_DIR}")
    endif()
  endif()
  malle_nccl_decide(_malle_nccl _malle_nccl_why
                    REQUEST "${MALLE_WITH_NCCL}" WITH_TORCH "${MALLE_WITH_TORCH}"
                    TORCH_VERSION "${MALLE_NCCL_PROBE_TORCH_VERSION}"
                    TORCH_CUDA "${MALLE_NCCL_PROBE_TORCH_CUDA}"
                    TOOLKIT "${MALLE_NCCL_PROBE_TOOLKIT}" NCCL_INCLUDE "${_malle_nccl_include}")
  if(_malle_nccl STREQUAL "ERROR")
    message(FATAL_ERROR "malletrain: ${_malle_nccl_why}")
  endif()
  message(STATUS "malletrain: NCCL backend ${_malle_nccl} (${_malle_nccl_why})")
  set(MALLE_WITH_NCCL ${_malle_nccl})
  set(MALLE_NCCL_ENABLED ${_malle_nccl} CACHE INTERNAL "The NCCL decision (cmake/MalleNccl.cmake)")
endmacro()
