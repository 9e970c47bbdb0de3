# zt_add_plugin(NAME <name> KIND <kind> SOURCES <src>... [LIBRARIES <lib>...] [DESCRIPTOR <file>])
#
# The one way to build a zt plugin. zt's own plugins use this file from the source tree (the root
# CMakeLists.txt includes it); third parties get the very same file from an installed zt through
# find_package(zt) (lib/cmake/zt/ZtPlugin.cmake). It builds
#   - a MODULE library libzt-<name>.so that sees only the SDK headers (target zt::sdk), exports only
#     zt_plugin_entry (hidden visibility + version script) and links nothing from the host
#     (--no-undefined proves it);
#   - a descriptor <name>.plugin (name, kind, library, abi) next to the build tree's other
#     descriptors, so `zt-run --plugin-path <build>/share/zt/plugins.d` finds the plugin before it is
#     installed; and installs both.
# KIND is one of tokenizer, model, optimizer, zero, attention, parallel. DESCRIPTOR installs a
# hand-written descriptor instead of the generated one.
#
# Where things go (set before calling, or -D on the command line; the build tree mirrors the install
# tree so one relative library path works in both):
#   ZT_PLUGIN_INSTALL_DIR     the .so (default lib/zt/plugins under the install prefix)
#   ZT_PLUGINS_D_INSTALL_DIR  the descriptor (default share/zt/plugins.d under the install prefix).
#                             An absolute directory is allowed, e.g. $HOME/.local/share/zt/plugins.d
#                             (zt-run's per-user directory) or zt_PLUGINS_D_DIR (the plugins.d of the
#                             zt that find_package found); the descriptor then names the installed
#                             .so by its absolute path.
#   ZT_BUILD_PLUGIN_DIR, ZT_BUILD_PLUGINS_D_DIR  the same two in the build tree.

include(GNUInstallDirs)

# Remembered now: inside the function CMAKE_CURRENT_LIST_DIR is the caller's directory.
set(_ZT_PLUGIN_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
include("${_ZT_PLUGIN_CMAKE_DIR}/ZtPluginDescriptor.cmake")

# The SDK headers. ztConfig.cmake (installed zt) sets zt_INCLUDE_DIR and imports zt::sdk before
# including this file; in the zt source tree both come from include/ next to this folder.
if(NOT DEFINED zt_INCLUDE_DIR)
  get_filename_component(zt_INCLUDE_DIR "${_ZT_PLUGIN_CMAKE_DIR}/../include" ABSOLUTE)
endif()
if(NOT TARGET zt::sdk)
  add_library(zt_sdk INTERFACE)
  add_library(zt::sdk ALIAS zt_sdk)
  set_target_properties(zt_sdk PROPERTIES EXPORT_NAME sdk)
  target_include_directories(zt_sdk INTERFACE
    "$<BUILD_INTERFACE:${zt_INCLUDE_DIR}>" "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
endif()

# The ABI the headers define: descriptors record it, so a mismatch is visible without dlopen.
file(STRINGS "${zt_INCLUDE_DIR}/zt/zt_types.h" _zt_abi_defines REGEX "^#define ZT_ABI_M(AJ|IN)OR ")
if(NOT _zt_abi_defines MATCHES "ZT_ABI_MAJOR ([0-9]+)u?.*ZT_ABI_MINOR ([0-9]+)u?")
  message(FATAL_ERROR "zt: cannot read ZT_ABI_MAJOR/ZT_ABI_MINOR from ${zt_INCLUDE_DIR}/zt/zt_types.h; "
                      "the SDK headers are incomplete: reinstall zt")
endif()
set(zt_ABI_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")

# Destinations; the zt source tree sets them in its root CMakeLists.txt before including this file.
if(NOT DEFINED ZT_PLUGIN_INSTALL_DIR)
  set(ZT_PLUGIN_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/zt/plugins" CACHE STRING
      "Where zt_add_plugin installs plugin libraries (relative to the install prefix, or absolute)")
endif()
if(NOT DEFINED ZT_PLUGINS_D_INSTALL_DIR)
  set(ZT_PLUGINS_D_INSTALL_DIR "${CMAKE_INSTALL_DATADIR}/zt/plugins.d" CACHE STRING
      "Where zt_add_plugin installs plugin descriptors (relative to the install prefix, or absolute)")
endif()
if(NOT DEFINED ZT_BUILD_PLUGIN_DIR)
  set(ZT_BUILD_PLUGIN_DIR "${CMAKE_BINARY_DIR}/lib/zt/plugins")
endif()
if(NOT DEFINED ZT_BUILD_PLUGINS_D_DIR)
  set(ZT_BUILD_PLUGINS_D_DIR "${CMAKE_BINARY_DIR}/share/zt/plugins.d")
endif()

set(_ZT_PLUGIN_KINDS tokenizer model optimizer zero attention parallel adapter)
set(_ZT_PLUGIN_USAGE "zt_add_plugin(NAME <name> KIND <kind> SOURCES <src>... [LIBRARIES <lib>...] [DESCRIPTOR <file>])")

function(zt_add_plugin)
  cmake_parse_arguments(PARSE_ARGV 0 P "" "NAME;KIND;DESCRIPTOR" "SOURCES;LIBRARIES")
  if(P_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "zt_add_plugin: unexpected argument(s) '${P_UNPARSED_ARGUMENTS}'; usage: ${_ZT_PLUGIN_USAGE}")
  endif()
  if(NOT P_NAME OR NOT P_KIND OR NOT P_SOURCES)
    message(FATAL_ERROR "zt_add_plugin: NAME, KIND and SOURCES are required; usage: ${_ZT_PLUGIN_USAGE}")
  endif()
  # The name is how users select the plugin (--plugins, optimizer.type); the registry accepts these.
  string(LENGTH "${P_NAME}" name_length)
  if(NOT P_NAME MATCHES "^[a-z0-9][a-z0-9._-]*$" OR name_length GREATER 63)
    message(FATAL_ERROR "zt_add_plugin: invalid NAME '${P_NAME}': use 1 to 63 lower-case letters, digits, "
                        "'-', '_' or '.', starting with a letter or digit (e.g. NAME lion)")
  endif()
  if(NOT P_KIND IN_LIST _ZT_PLUGIN_KINDS)
    string(REPLACE ";" ", " kinds "${_ZT_PLUGIN_KINDS}")
    message(FATAL_ERROR "zt_add_plugin(${P_NAME}): unknown KIND '${P_KIND}'; use one of: ${kinds}")
  endif()

  set(target zt-plugin-${P_NAME})
  set(library_file "libzt-${P_NAME}.so")
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "zt-${P_NAME}"
    SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY "${ZT_BUILD_PLUGIN_DIR}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(${target} PRIVATE zt::sdk ${P_LIBRARIES})
  # Only the entry symbol is exported; --no-undefined proves the plugin needs nothing from the host.
  # (Sanitizer builds of zt leave the sanitizer runtime to the executable, so they skip the check.)
  set(version_script "${_ZT_PLUGIN_CMAKE_DIR}/zt-plugin.map")
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${version_script}"
    "$<$<NOT:$<BOOL:${ZT_SANITIZE}>>:LINKER:--no-undefined>")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${version_script}")
  install(TARGETS ${target} LIBRARY DESTINATION "${ZT_PLUGIN_INSTALL_DIR}")

  set(build_descriptor "${ZT_BUILD_PLUGINS_D_DIR}/${P_NAME}.plugin")
  if(P_DESCRIPTOR)
    configure_file("${P_DESCRIPTOR}" "${build_descriptor}" COPYONLY)
    install(FILES "${P_DESCRIPTOR}" DESTINATION "${ZT_PLUGINS_D_INSTALL_DIR}")
    return()
  endif()
  file(RELATIVE_PATH library_from_descriptor "${ZT_BUILD_PLUGINS_D_DIR}" "${ZT_BUILD_PLUGIN_DIR}/${library_file}")
  zt_write_plugin_descriptor("${build_descriptor}" NAME "${P_NAME}" KIND "${P_KIND}"
                             LIBRARY "${library_from_descriptor}" ABI "${zt_ABI_VERSION}")
  # The installed descriptor is written at install time: only then is the final prefix known
  # (cmake --install --prefix). zt_PLUGINS_D_DIR is set for third parties by ztConfig.cmake.
  install(CODE "
    include(\"${_ZT_PLUGIN_CMAKE_DIR}/ZtPluginDescriptor.cmake\")
    zt_stage_installed_descriptor(NAME \"${P_NAME}\" KIND \"${P_KIND}\" ABI \"${zt_ABI_VERSION}\"
      LIBRARY_FILE \"${library_file}\" LIBRARY_DIR \"${ZT_PLUGIN_INSTALL_DIR}\"
      DESCRIPTOR_DIR \"${ZT_PLUGINS_D_INSTALL_DIR}\" ZT_PLUGINS_D \"${zt_PLUGINS_D_DIR}\"
      STAGING_DIR \"${CMAKE_CURRENT_BINARY_DIR}/zt-install-staging\")
    file(INSTALL \"\${zt_staged_descriptor}\" DESTINATION \"\${zt_descriptor_dir}\") # adds DESTDIR itself
  ")
endfunction()
