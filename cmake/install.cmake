# Install rules: libqkv (static and shared: qkv::qkv is the QKV_SHARED kind, qkv::qkv_static or
# qkv::qkv_shared the other), its public headers, a CMake package (qkvConfig.cmake,
# version file, exported qkv::qkv and, with MPI, qkv::qkv_distributed), pkg-config's qkv.pc, the
# command's data, and the CPack settings of `make package`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QKV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)
list(GET QKV_OTHER_KIND 0 QKV_OTHER_TARGET)
install(TARGETS qkv ${QKV_OTHER_TARGET} EXPORT qkvTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT qkvTargets NAMESPACE qkv:: DESTINATION ${QKV_CMAKE_DIR})
# The ring API (qkv/distributed.h and the qkv/sharding.h it includes, qkv::qkv_distributed) in an
# export of its own, which qkvConfig.cmake loads only when the consumer's CMake finds MPI too (component `distributed`).
if(TARGET qkv_distributed)
  target_sources(qkv_distributed PUBLIC FILE_SET HEADERS BASE_DIRS ${PROJECT_SOURCE_DIR}/include
    FILES ${PROJECT_SOURCE_DIR}/include/qkv/distributed.h ${PROJECT_SOURCE_DIR}/include/qkv/sharding.h)
  install(TARGETS qkv_distributed EXPORT qkvDistributedTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT qkvDistributedTargets NAMESPACE qkv:: DESTINATION ${QKV_CMAKE_DIR})
endif()

# The data the qkv command reads by default (find_data_file in tools/qkv: <prefix>/share/qkv):
# whichever of the word vectors and the trained layer `make demo` has built into build/data.
install(FILES ${QKV_DATA_DIR}/words.txt ${QKV_DATA_DIR}/context-layer.safetensors
  DESTINATION ${CMAKE_INSTALL_DATADIR}/qkv OPTIONAL)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/qkvConfig.cmake INSTALL_DESTINATION ${QKV_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qkvConfig.cmake ${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
  DESTINATION ${QKV_CMAKE_DIR})

# pkg-config: -lqkv links the shared libqkv; `pkg-config --static` adds what the static one needs
# (Libs.private). Libs carries
# an rpath to libdir, so a program linked against the shared libqkv of any prefix runs without
# LD_LIBRARY_PATH (the .pc is relocatable, so the rpath is wherever the prefix is when linking).
file(RELATIVE_PATH QKV_PC_UP ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
# file(RELATIVE_PATH) ends the way up with a "/" ("../../"): kept, the prefix and every path built
# on it would hold a "//".
string(REGEX REPLACE "/+$" "" QKV_PC_UP "${QKV_PC_UP}")
# Nix and some distributions pass an absolute CMAKE_INSTALL_LIBDIR or INCLUDEDIR: such a dir is
# written as it is, since "${prefix}/" before it names no directory. The way up above holds then
# too: it leads from that fixed libdir to the configured prefix, where such a tree is installed.
foreach(dir LIBDIR INCLUDEDIR)
  cmake_path(IS_ABSOLUTE CMAKE_INSTALL_${dir} _absolute)
  if(_absolute)
    set(QKV_PC_${dir} ${CMAKE_INSTALL_${dir}})
  else()
    set(QKV_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/qkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qkv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# `make package` (after `make demo`, for the data): a .deb of the library, headers, CMake package,
# pkg-config file, the qkv command with its data under /usr/share/qkv and the Python module.
# Written to the build directory: apt-get install ./build/qkv_*.deb
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME qkv)
set(CPACK_PACKAGE_VENDOR "qkv developers")
set(CPACK_PACKAGE_CONTACT "qkv developers <qkv@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# dpkg-shlibdeps finds the shared libraries the binaries load (fmt, OpenBLAS, gomp, libstdc++);
# the -dev packages are what the headers and the CMake package need to compile against.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfmt-dev, libopenblas-dev, python3-numpy")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
