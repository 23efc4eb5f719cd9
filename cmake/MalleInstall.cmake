# What `cmake --install` and the wheel get (docs/install.md).
#
# Two install components:
#   dev     the CMake package: the static libmalle libraries, their public headers (each
#           module's MALLE_<MODULE>_PUBLIC_HDRS list: that list *is* the module's installed
#           API) and lib/cmake/malle/malleConfig.cmake, so that a project does
#           find_package(malle CONFIG REQUIRED) and links malle::<module>. The default of
#           `cmake --install <build> --prefix <dir>`.
#   python  the extension, the generated _build_info.py and the executables, laid out as in
#           site-packages. Only scikit-build-core installs it (pyproject.toml), into the wheel;
#           its rules are EXCLUDE_FROM_ALL so a plain `cmake --install` leaves it out.
#
#   malle_install_module(<module> TARGETS <target>... HEADERS <header>...)
#       Exports <target> (malle_foo -> malle::foo, also an in-tree ALIAS) and installs
#       <header> to include/libmalle/<module>/. Called at the end of each
#       libmalle/<module>/CMakeLists.txt.
#   malle_install_in_wheel(<target> <dir>)
#       Installs <target> at <dir> inside site-packages with an RPATH relative to itself
#       that reaches torch's libraries in the same site-packages ($ORIGIN/../torch/lib for
#       malletrain/_C.so). The libraries that auditwheel bundles (Abseil, CBC, OpenSSL, ...)
#       get their own $ORIGIN entry from auditwheel repair (tests/setup_env.sh).
#   malle_install_package()
#       The export set, malleConfig.cmake and its version file (after every module), and the
#       malle_python_package target: everything the wheel holds, the demo's build target.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MALLE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/malle")

function(malle_install_module module)
  cmake_parse_arguments(ARG "" "" "TARGETS;HEADERS" ${ARGN})
  foreach(target IN LISTS ARG_TARGETS)
    string(REGEX REPLACE "^malle_" "" name "${target}")
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
    add_library(malle::${name} ALIAS ${target})
  endforeach()
  install(TARGETS ${ARG_TARGETS} EXPORT malleTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  if(ARG_HEADERS)
    install(FILES ${ARG_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/libmalle/${module}
            COMPONENT dev)
  endif()
endfunction()

function(malle_install_in_wheel target dir)
  # From <dir> back up to site-packages: "malletrain/bin" -> "../..".
  file(RELATIVE_PATH up "/site-packages/${dir}" "/site-packages")
  string(REGEX REPLACE "/$" "" up "${up}")
  set(rpath "$ORIGIN/${up}/torch/lib")
  get_target_property(links ${target} LINK_LIBRARIES)
  if(MALLE_WITH_NCCL AND MALLE_CUDART_SITE_DIR AND "malle_comm_nccl" IN_LIST links)
    # libcudart.so.13 of torch's nvidia-cuda-runtime dependency, not /usr/local/cuda's.
    list(APPEND rpath "$ORIGIN/${up}/${MALLE_CUDART_SITE_DIR}")
  endif()
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "${rpath}")
  # One DESTINATION for every kind of artifact, so COMPONENT applies to them all.
  install(TARGETS ${target} DESTINATION ${dir} COMPONENT python EXCLUDE_FROM_ALL)
  set_property(GLOBAL APPEND PROPERTY MALLE_WHEEL_TARGETS ${target})
endfunction()

if(MALLE_WITH_NCCL)
  # Where torch's libcudart lives, relative to site-packages (nvidia/cu13/lib for the cu130
  # wheel); empty if torch came without it.
  get_filename_component(_malle_site "${MALLE_TORCH_LIB_DIR}/../.." ABSOLUTE)
  file(GLOB _malle_cudart "${_malle_site}/nvidia/*/lib/libcudart.so.*")
  set(MALLE_CUDART_SITE_DIR "")
  if(_malle_cudart)
    list(GET _malle_cudart 0 _malle_cudart)
    get_filename_component(_malle_cudart "${_malle_cudart}" DIRECTORY)
    file(RELATIVE_PATH MALLE_CUDART_SITE_DIR "${_malle_site}" "${_malle_cudart}")
  endif()
endif()

function(malle_install_package)
  set(exported malle_torch)
  if(TARGET malle_torch_cuda)
    list(APPEND exported malle_torch_cuda)
  endif()
  if(MALLE_WITH_TORCH)
    malle_install_module(torch TARGETS ${exported})
  endif()
  install(EXPORT malleTargets NAMESPACE malle:: DESTINATION ${MALLE_INSTALL_CMAKEDIR}
          COMPONENT dev)
  set(MALLE_BUILT_TORCH_VERSION "${Torch_VERSION}")
  configure_package_config_file(
    "${PROJECT_SOURCE_DIR}/cmake/malleConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/malleConfig.cmake"
    INSTALL_DESTINATION ${MALLE_INSTALL_CMAKEDIR})
  # 0.x: a minor version may change the API.
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/malleConfigVersion.cmake"
                                   COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/malleConfig.cmake"
                "${PROJECT_BINARY_DIR}/malleConfigVersion.cmake"
                "${PROJECT_SOURCE_DIR}/cmake/malleTorch.cmake"
          DESTINATION ${MALLE_INSTALL_CMAKEDIR} COMPONENT dev)

  get_property(wheel_targets GLOBAL PROPERTY MALLE_WHEEL_TARGETS)
  add_custom_target(malle_python_package)
  if(wheel_targets)
    add_dependencies(malle_python_package ${wheel_targets})
  endif()
endfunction()
