# build_info.cmake — writes OUT (a header with NSTF_BUILD_COMMIT and
# NSTF_BUILD_NUMBER, llama-bench's build_commit / build_number) from the git
# state of SRC at build time, rewriting it only when it changed, so every
# build records the commit it was built from (not the one it was configured
# at); "-dirty" follows the commit when tracked files differ from it, so
# a figure measured on uncommitted code is not credited to the commit.
# Run as: cmake -DSRC=<source dir> -DOUT=<header> -P build_info.cmake
set(commit "unknown")
set(count 0)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE c OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-list --count HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE n OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND c)
    set(commit ${c})
    set(count ${n})
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(dirty)
      set(commit "${c}-dirty")
    endif()
  endif()
endif()
set(text "/* Generated at build time by cmake/build_info.cmake. */\n#define NSTF_BUILD_COMMIT \"${commit}\"\n#define NSTF_BUILD_NUMBER ${count}\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
