# zt_add_plugin(NAME <name> KIND <kind> SOURCES <src>... [LIBRARIES <lib>...] [DESCRIPTOR <file>])
#
# Builds an in-tree plugin exactly as a third party would: a MODULE library libzt-<name>.so that sees
# only include/zt (the SDK), exports only zt_plugin_entry (hidden visibility + version script), and
# links nothing from the host. The descriptor plugins.d/<name>.plugin is copied next to the build
# tree's other descriptors and installed with the library.
function(zt_add_plugin)
  cmake_parse_arguments(P "" "NAME;KIND;DESCRIPTOR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT P_NAME OR NOT P_KIND OR NOT P_SOURCES)
    message(FATAL_ERROR "zt_add_plugin needs NAME, KIND and SOURCES")
  endif()
  if(NOT P_DESCRIPTOR)
    set(P_DESCRIPTOR "${PROJECT_SOURCE_DIR}/plugins.d/${P_NAME}.plugin")
  endif()
  set(target zt-plugin-${P_NAME})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME "zt-${P_NAME}"
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY "${ZT_BUILD_PLUGIN_DIR}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/include")
  # Only the entry symbol is exported; --no-undefined proves the plugin needs nothing from the host.
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/zt-plugin.map"
    "$<$<NOT:$<BOOL:${ZT_SANITIZE}>>:LINKER:--no-undefined>")
  if(P_LIBRARIES)
    target_link_libraries(${target} PRIVATE ${P_LIBRARIES})
  endif()
  configure_file("${P_DESCRIPTOR}" "${ZT_BUILD_PLUGINS_D_DIR}/${P_NAME}.plugin" COPYONLY)
  install(TARGETS ${target} LIBRARY DESTINATION "${ZT_PLUGIN_INSTALL_DIR}")
  install(FILES "${P_DESCRIPTOR}" DESTINATION "${ZT_PLUGINS_D_INSTALL_DIR}")
endfunction()
