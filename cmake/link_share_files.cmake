# Install step of the dev venv (FED_ROS_INSTALL_PYTHON_SOURCES=OFF): put every file of launch/
# and config/ into <prefix>/share/fed_ros as a symlink to the source file, creating real
# directories (ros2 launch finds share/<pkg>/launch/<file> but does not follow a linked
# directory). Expects FED_ROS_SOURCE_DIR; honours DESTDIR like install(DIRECTORY).
set(_share "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/share/fed_ros")
foreach(_dir launch config)
  if(IS_SYMLINK "${_share}/${_dir}")  # a hand-made linked directory from an older setup
    file(REMOVE "${_share}/${_dir}")
  endif()
  file(GLOB_RECURSE _files RELATIVE "${FED_ROS_SOURCE_DIR}" "${FED_ROS_SOURCE_DIR}/${_dir}/*")
  foreach(_file ${_files})
    if(_file MATCHES "__pycache__")
      continue()
    endif()
    get_filename_component(_parent "${_share}/${_file}" DIRECTORY)
    file(MAKE_DIRECTORY "${_parent}")
    message(STATUS "Symlinking: ${_share}/${_file}")
    file(CREATE_LINK "${FED_ROS_SOURCE_DIR}/${_file}" "${_share}/${_file}" SYMBOLIC)
  endforeach()
endforeach()
