# What `cmake --install` puts in the prefix besides the programs and the in-tree plugins (which
# zt_add_plugin installs): the plugin SDK (headers, CMake package, pkg-config file), an empty
# plugins.d for third-party descriptors, the documentation and the examples. docs/plugins.md shows
# how a plugin author uses them.
include(CMakePackageConfigHelpers)

set(ZT_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/zt")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/zt" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY DESTINATION "${ZT_PLUGINS_D_INSTALL_DIR}")

# CMake package: find_package(zt) -> zt::sdk, zt_add_plugin(), zt_PLUGINS_D_DIR (ztConfig.cmake.in).
install(TARGETS zt_sdk EXPORT ztTargets)
install(EXPORT ztTargets NAMESPACE zt:: DESTINATION "${ZT_CMAKE_INSTALL_DIR}")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/ztConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/ztConfig.cmake"
  INSTALL_DESTINATION "${ZT_CMAKE_INSTALL_DIR}"
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR ZT_PLUGIN_INSTALL_DIR ZT_PLUGINS_D_INSTALL_DIR)
# The package version is zt's; plugin compatibility is decided by the ABI version (zt_ABI_VERSION).
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ztConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMajorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/ztConfig.cmake"
  "${PROJECT_BINARY_DIR}/ztConfigVersion.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/ZtPlugin.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/ZtPluginDescriptor.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/zt-plugin.map"
  DESTINATION "${ZT_CMAKE_INSTALL_DIR}")

# pkg-config: configured at install time, so its paths are those of the prefix actually installed
# to (cmake --install --prefix).
install(CODE "
  include(\"${PROJECT_SOURCE_DIR}/cmake/ZtPluginDescriptor.cmake\")
  zt_install_dir_to_absolute(ZT_PC_PREFIX \".\")
  zt_install_dir_to_absolute(ZT_PC_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  zt_install_dir_to_absolute(ZT_PC_PLUGINDIR \"${ZT_PLUGIN_INSTALL_DIR}\")
  zt_install_dir_to_absolute(ZT_PC_PLUGINSDDIR \"${ZT_PLUGINS_D_INSTALL_DIR}\")
  zt_install_dir_to_absolute(ZT_PC_CMAKEDIR \"${ZT_CMAKE_INSTALL_DIR}\")
  set(ZT_PC_VERSION \"${PROJECT_VERSION}\")
  set(ZT_PC_ABI \"${zt_ABI_VERSION}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/cmake/zt.pc.in\" \"${PROJECT_BINARY_DIR}/zt-install-staging/zt.pc\" @ONLY)
  zt_install_dir_to_absolute(zt_pc_dir \"${CMAKE_INSTALL_LIBDIR}/pkgconfig\")
  file(INSTALL \"${PROJECT_BINARY_DIR}/zt-install-staging/zt.pc\" DESTINATION \"\${zt_pc_dir}\")
")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION "${CMAKE_INSTALL_DOCDIR}")
# Skips build trees made inside an example (its README's `cmake -S . -B build`).
install(DIRECTORY "${PROJECT_SOURCE_DIR}/examples/" DESTINATION "${CMAKE_INSTALL_DOCDIR}/examples"
        REGEX "/examples/[^/]+/build(-[^/]*)?$" EXCLUDE)
