# Run at every build (target kbn_commit): writes OUT with the commit the sources are at now, "+dirty" when
# tracked files differ from it. configure_file rewrites OUT only when the text changes, so an unchanged
# commit rebuilds nothing.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE KBN_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE _dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT KBN_GIT_COMMIT)
  set(KBN_GIT_COMMIT "unknown")
elseif(_dirty)
  set(KBN_GIT_COMMIT "${KBN_GIT_COMMIT}+dirty")
endif()
file(CONFIGURE OUTPUT ${OUT} CONTENT "#pragma once\n#define KBN_GIT_COMMIT \"${KBN_GIT_COMMIT}\"\n" @ONLY)
