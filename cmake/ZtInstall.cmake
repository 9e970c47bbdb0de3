# SDK installation: headers, pkg-config file and CMake package (owned by the SDK work; see docs/plugins.md).
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/zt" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
