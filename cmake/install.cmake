# Install rules: libqkv (static and shared: qkv::qkv is the QKV_SHARED kind, qkv::qkv_static or
# qkv::qkv_shared the other), its public headers, a CMake package (qkvConfig.cmake,
# version file, exported qkv::qkv), pkg-config's qkv.pc, and the CPack settings of `make package`.
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
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/qkvConfig.cmake INSTALL_DESTINATION ${QKV_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qkvConfig.cmake ${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
  DESTINATION ${QKV_CMAKE_DIR})

# pkg-config: a static libqkv needs its private dependencies on the link line too.
file(RELATIVE_PATH QKV_PC_UP ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
if(QKV_SHARED)
  set(QKV_PC_LIBS_PRIVATE "")
else()
  set(QKV_PC_LIBS_PRIVATE "-lfmt -ldl -lpthread")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/qkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qkv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# `make package`: a .deb of the library, headers, CMake package and the qkv command.
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
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfmt-dev, libopenblas-dev, libgomp1, python3-numpy")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
