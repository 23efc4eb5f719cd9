# libmalle's narrow view of LibTorch, shared by its own build (MalleDependencies.cmake) and by
# the installed CMake package (malleConfig.cmake), so that a project using find_package(malle)
# compiles libmalle's headers with exactly the flags libmalle was compiled with.
#
#   malle_find_torch(<python> <with_cuda>)
#       Finds LibTorch: <python>'s torch (torch.utils.cmake_prefix_path) when <python> is not
#       empty, else find_package(Torch) on the prefix path (Torch_DIR, CMAKE_PREFIX_PATH).
#       Does nothing if Torch_FOUND is already true. Sets Torch_FOUND, Torch_VERSION,
#       TORCH_INCLUDE_DIRS, TORCH_CXX_FLAGS (TorchConfig's) and MALLE_TORCH_LIB_DIR; on
#       failure Torch_FOUND is false and MALLE_TORCH_ERROR says why.
#   malle_torch_usage(<target> <BUILD|IMPORTED> [CUDA])
#       Gives <target> (an INTERFACE or IMPORTED INTERFACE library) libmalle's usage
#       requirements on LibTorch: torch's include dirs, libtorch_cpu + libc10 (with CUDA:
#       libtorch_cuda + libc10_cuda + CUDA::cudart), TORCH_CXX_FLAGS and the c10d Gloo macros.
#       BUILD wraps every value in $<BUILD_INTERFACE:...>: libmalle's own build points at the
#       torch of its .venv, which must not leak into the installed package; the package's
#       config fills the IMPORTED target from the consumer's torch instead.
#
# Not the `torch` target of TorchConfig.cmake: that one carries the CUDA interface flags
# and libraries of the CUDA wheel, which ranks without NCCL must not load.

macro(malle_find_torch _malle_python _malle_with_cuda)
  set(MALLE_TORCH_ERROR "")
  if(NOT ${_malle_with_cuda})
    # The PyPI wheel is a CUDA build; without NCCL none of its CUDA targets is needed, and
    # skipping them keeps programs from loading the CUDA libraries.
    set(CAFFE2_USE_CUDA OFF CACHE BOOL "" FORCE)
  endif()
  if(NOT Torch_FOUND AND NOT "${_malle_python}" STREQUAL "")
    # The interpreter's torch first: a LibTorch elsewhere on the prefix path (Debian's
    # libtorch-dev, say) is another version, whose ABI the extension must not meet.
    execute_process(
      COMMAND "${_malle_python}" -c
              "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
      OUTPUT_VARIABLE _malle_torch_prefix
      ERROR_VARIABLE _malle_torch_stderr
      RESULT_VARIABLE _malle_torch_rc)
    if(_malle_torch_rc EQUAL 0)
      list(PREPEND CMAKE_PREFIX_PATH "${_malle_torch_prefix}")
    else()
      string(STRIP "${_malle_torch_stderr}" _malle_torch_stderr)
      string(REGEX REPLACE ".*\n" "" _malle_torch_stderr "${_malle_torch_stderr}")
      set(MALLE_TORCH_ERROR "${_malle_python} cannot import torch (${_malle_torch_stderr})")
    endif()
  endif()
  if(NOT Torch_FOUND AND MALLE_TORCH_ERROR STREQUAL "")
    find_package(Torch CONFIG QUIET)
  endif()
  if(Torch_FOUND)
    get_filename_component(MALLE_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
  elseif(MALLE_TORCH_ERROR STREQUAL "")
    string(CONCAT MALLE_TORCH_ERROR "LibTorch not found: give -DPython_EXECUTABLE=<a python "
                  "with torch>, or put torch.utils.cmake_prefix_path on CMAKE_PREFIX_PATH")
  endif()
endmacro()

function(malle_torch_usage target mode)
  set(with_cuda FALSE)
  if("CUDA" IN_LIST ARGN)
    set(with_cuda TRUE)
  endif()
  set(names torch_cpu c10)
  if(with_cuda)
    set(names torch_cuda c10_cuda)
  endif()
  set(libs "")
  foreach(name IN LISTS names)
    find_library(MALLE_TORCH_LIB_${name} ${name} PATHS "${MALLE_TORCH_LIB_DIR}" NO_DEFAULT_PATH)
    if(NOT MALLE_TORCH_LIB_${name})
      message(FATAL_ERROR "malle: lib${name}.so not found in ${MALLE_TORCH_LIB_DIR}")
    endif()
    list(APPEND libs "${MALLE_TORCH_LIB_${name}}")
  endforeach()
  set(includes "")
  set(defines "")
  set(options "")
  if(with_cuda)
    list(APPEND libs CUDA::cudart)
  else()
    set(includes ${TORCH_INCLUDE_DIRS})
    set(defines USE_C10D_GLOO USE_DISTRIBUTED)
    separate_arguments(options UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  endif()
  if(mode STREQUAL "BUILD")
    foreach(list_name IN ITEMS libs includes defines options)
      set(wrapped "")
      foreach(item IN LISTS ${list_name})
        list(APPEND wrapped "$<BUILD_INTERFACE:${item}>")
      endforeach()
      set(${list_name} "${wrapped}")
    endforeach()
  endif()
  if(mode STREQUAL "BUILD")
    target_include_directories(${target} SYSTEM INTERFACE ${includes})
    target_link_libraries(${target} INTERFACE ${libs})
    target_compile_options(${target} INTERFACE ${options})
    target_compile_definitions(${target} INTERFACE ${defines})
  else()
    # Imported targets' include directories are SYSTEM for their users already.
    set_target_properties(${target} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${includes}"
      INTERFACE_LINK_LIBRARIES "${libs}"
      INTERFACE_COMPILE_OPTIONS "${options}"
      INTERFACE_COMPILE_DEFINITIONS "${defines}")
  endif()
endfunction()
