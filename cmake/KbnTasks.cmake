# Compiles every task source once per variant (see kbn/variant.h) and generates the include graph.
set(KBN_BASELINE_DIR ${CMAKE_SOURCE_DIR}/tasks/baseline)
file(GLOB_RECURSE KBN_BASELINE_FILES CONFIGURE_DEPENDS RELATIVE ${KBN_BASELINE_DIR}
     ${KBN_BASELINE_DIR}/L*/*.h ${KBN_BASELINE_DIR}/L*/*.cuh ${KBN_BASELINE_DIR}/L*/*.cu)
file(GLOB_RECURSE KBN_CANDIDATE_FILES CONFIGURE_DEPENDS RELATIVE ${KBN_CANDIDATE_DIR}
     ${KBN_CANDIDATE_DIR}/L*/*.h ${KBN_CANDIDATE_DIR}/L*/*.cuh ${KBN_CANDIDATE_DIR}/L*/*.cu)
list(SORT KBN_BASELINE_FILES)
list(SORT KBN_CANDIDATE_FILES)

foreach(f IN LISTS KBN_CANDIDATE_FILES)
  if(NOT f IN_LIST KBN_BASELINE_FILES)
    message(FATAL_ERROR "kb-nano: candidate file ${KBN_CANDIDATE_DIR}/${f} has no baseline twin "
                        "tasks/baseline/${f}; a candidate replaces an existing task file at the same path "
                        "(run 'kb_nano list' to see the task files)")
  endif()
endforeach()

set(KBN_HAVE_CANDIDATE OFF)
if(KBN_CANDIDATE_FILES)
  set(KBN_HAVE_CANDIDATE ON)
  message(STATUS "kb-nano: candidate files: ${KBN_CANDIDATE_FILES}")
endif()

function(kbn_add_task_variant variant)
  set(srcs ${CMAKE_SOURCE_DIR}/tasks/registry.cpp)
  foreach(f IN LISTS KBN_BASELINE_FILES)
    if(f MATCHES "\\.cu$")
      if(variant STREQUAL "candidate" AND f IN_LIST KBN_CANDIDATE_FILES)
        list(APPEND srcs ${KBN_CANDIDATE_DIR}/${f})
      else()
        list(APPEND srcs ${KBN_BASELINE_DIR}/${f})
      endif()
    endif()
  endforeach()
  kbn_cuda_sources_as_cxx(${srcs})
  set(target kbn_tasks_${variant})
  add_library(${target} STATIC ${srcs})
  target_compile_definitions(${target} PRIVATE KBN_VARIANT=${variant})
  if(variant STREQUAL "candidate")
    target_include_directories(${target} PRIVATE ${KBN_CANDIDATE_DIR})
  endif()
  target_include_directories(${target} PRIVATE ${KBN_BASELINE_DIR} ${CMAKE_SOURCE_DIR}/tasks)
  target_link_libraries(${target} PUBLIC kbn_reference)
endfunction()

kbn_add_task_variant(baseline)
if(KBN_HAVE_CANDIDATE)
  kbn_add_task_variant(candidate)
endif()

# Include graph of both variants, regenerated whenever a task file changes.
set(_graph_cpp ${CMAKE_BINARY_DIR}/generated/include_graph.cpp)
set(_deps)
foreach(f IN LISTS KBN_BASELINE_FILES)
  list(APPEND _deps ${KBN_BASELINE_DIR}/${f})
endforeach()
foreach(f IN LISTS KBN_CANDIDATE_FILES)
  list(APPEND _deps ${KBN_CANDIDATE_DIR}/${f})
endforeach()
string(REPLACE ";" "|" _bl "${KBN_BASELINE_FILES}")
string(REPLACE ";" "|" _cl "${KBN_CANDIDATE_FILES}")
add_custom_command(
  OUTPUT ${_graph_cpp}
  COMMAND ${CMAKE_COMMAND} -DBASELINE_DIR=${KBN_BASELINE_DIR} -DCANDIDATE_DIR=${KBN_CANDIDATE_DIR}
          "-DBASELINE_FILES=${_bl}" "-DCANDIDATE_FILES=${_cl}" -DOUT=${_graph_cpp}
          -P ${CMAKE_SOURCE_DIR}/cmake/gen_include_graph.cmake
  DEPENDS ${_deps} ${CMAKE_SOURCE_DIR}/cmake/gen_include_graph.cmake
  COMMENT "kb-nano: include graph of the task files"
  VERBATIM)

add_library(kbn_tasks STATIC ${CMAKE_SOURCE_DIR}/tasks/registry_glue.cpp ${_graph_cpp})
target_link_libraries(kbn_tasks PUBLIC kbn_tasks_baseline)
if(KBN_HAVE_CANDIDATE)
  target_link_libraries(kbn_tasks PUBLIC kbn_tasks_candidate)
  target_compile_definitions(kbn_tasks PRIVATE KBN_HAVE_CANDIDATE=1)
endif()
