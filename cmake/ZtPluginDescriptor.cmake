# Plugin descriptors (format: framework/host/registry.h, docs/plugins.md). Used by zt_add_plugin at
# configure time for the build tree, and by `cmake --install` for the installed tree, in the zt
# source tree and in an installed SDK alike.

# zt_write_plugin_descriptor(<file> NAME <name> KIND <kind> LIBRARY <path> ABI <major.minor>)
# LIBRARY is absolute, or relative to the descriptor's directory.
function(zt_write_plugin_descriptor file)
  cmake_parse_arguments(PARSE_ARGV 1 D "" "NAME;KIND;LIBRARY;ABI" "")
  set(text "# zt plugin descriptor written by zt_add_plugin (docs/plugins.md)\n")
  string(APPEND text "name = ${D_NAME}\nkind = ${D_KIND}\nlibrary = ${D_LIBRARY}\nabi = ${D_ABI}\n")
  # Rewrite only on change, so reconfiguring or reinstalling leaves an identical file untouched.
  if(EXISTS "${file}")
    file(READ "${file}" old_text)
    if(old_text STREQUAL text)
      return()
    endif()
  endif()
  file(WRITE "${file}" "${text}")
endfunction()

# zt_install_dir_to_absolute(<out> <dir>): an install destination as install() resolves it
# (relative to the install prefix in effect now), without DESTDIR.
function(zt_install_dir_to_absolute out dir)
  if(IS_ABSOLUTE "${dir}")
    set(absolute "${dir}")
  else()
    set(absolute "${CMAKE_INSTALL_PREFIX}/${dir}")
  endif()
  get_filename_component(absolute "${absolute}" ABSOLUTE) # normalizes "a/./b", "a/../b", "a/"
  set(${out} "${absolute}" PARENT_SCOPE)
endfunction()

# Run by `cmake --install`: writes the installed form of a descriptor into STAGING_DIR and sets
# zt_staged_descriptor and zt_descriptor_dir (absolute, without DESTDIR: file(INSTALL) adds it).
# Inside the install prefix the library path is relative, so the installed tree stays relocatable;
# a descriptor installed elsewhere (a per-user plugins.d) names the library by its absolute path.
# ZT_PLUGINS_D (third parties: zt_PLUGINS_D_DIR) enables a note when zt-run will not find the
# descriptor by itself.
function(zt_stage_installed_descriptor)
  cmake_parse_arguments(PARSE_ARGV 0 D ""
    "NAME;KIND;ABI;LIBRARY_FILE;LIBRARY_DIR;DESCRIPTOR_DIR;ZT_PLUGINS_D;STAGING_DIR" "")
  zt_install_dir_to_absolute(library_dir "${D_LIBRARY_DIR}")
  zt_install_dir_to_absolute(descriptor_dir "${D_DESCRIPTOR_DIR}")
  if(IS_ABSOLUTE "${D_LIBRARY_DIR}" OR IS_ABSOLUTE "${D_DESCRIPTOR_DIR}")
    set(library "${library_dir}/${D_LIBRARY_FILE}")
  else()
    file(RELATIVE_PATH library "${descriptor_dir}" "${library_dir}/${D_LIBRARY_FILE}")
  endif()
  set(staged "${D_STAGING_DIR}/${D_NAME}.plugin")
  zt_write_plugin_descriptor("${staged}" NAME "${D_NAME}" KIND "${D_KIND}" LIBRARY "${library}" ABI "${D_ABI}")

  if(D_ZT_PLUGINS_D)
    if(DEFINED ENV{XDG_DATA_HOME} AND NOT "$ENV{XDG_DATA_HOME}" STREQUAL "")
      set(user_dir "$ENV{XDG_DATA_HOME}/zt/plugins.d")
    else()
      set(user_dir "$ENV{HOME}/.local/share/zt/plugins.d")
    endif()
    get_filename_component(zt_dir "${D_ZT_PLUGINS_D}" ABSOLUTE)
    get_filename_component(user_dir "${user_dir}" ABSOLUTE)
    if(NOT descriptor_dir STREQUAL zt_dir AND NOT descriptor_dir STREQUAL user_dir)
      message(STATUS "Note: zt-run does not search ${descriptor_dir} by default: run it with "
                     "--plugin-path ${descriptor_dir} or ZT_PLUGIN_PATH=${descriptor_dir}, or install "
                     "with -DZT_PLUGINS_D_INSTALL_DIR=${zt_dir} (this zt) or =${user_dir} (per user)")
    endif()
  endif()
  set(zt_staged_descriptor "${staged}" PARENT_SCOPE)
  set(zt_descriptor_dir "${descriptor_dir}" PARENT_SCOPE)
endfunction()
