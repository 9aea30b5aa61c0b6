# Passed with -DCMAKE_PROJECT_INCLUDE=... when building against the ROS 2 PyPI wheels.
# Why: the wheels' exported CMake targets carry include directories from the machine
# they were built on (/opt/python/cp311-cp311/include/python3.11). CMake rejects
# non-existent INTERFACE_INCLUDE_DIRECTORIES at generate time, which breaks any
# package with a .srv or a std_msgs dependency. We drop those entries from every
# imported target once the top-level CMakeLists.txt has been processed.
function(_fed_ros_strip_opt_python_includes)
  get_property(_targets DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs)
      list(FILTER _dirs EXCLUDE REGEX "^/opt/python/")
      set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _fed_ros_strip_opt_python_includes)
