# Copies the shared libraries of BINARY that a bare GPU machine may lack (cpp-httplib and the brotli libraries it
# needs) into DEST, so DEST travels with the binary (which finds them through RPATH $ORIGIN/lib).
file(GET_RUNTIME_DEPENDENCIES EXECUTABLES ${BINARY} RESOLVED_DEPENDENCIES_VAR deps UNRESOLVED_DEPENDENCIES_VAR missing
     PRE_EXCLUDE_REGEXES "^libcuda\\.so")
file(MAKE_DIRECTORY ${DEST})
foreach(dep ${deps})
  get_filename_component(name ${dep} NAME)
  if(name MATCHES "^lib(cpp-httplib|brotli(common|dec|enc))\\.so")
    file(COPY ${dep} DESTINATION ${DEST} FOLLOW_SYMLINK_CHAIN)
  endif()
endforeach()
