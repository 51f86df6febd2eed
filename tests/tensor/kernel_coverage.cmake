# Every non-null entry of the CPU kernel table (the CPU's and the checked device's) is
# called by the op tests: sums the counts the coverage runs wrote (DISTJAX_KERNEL_COVERAGE:
# one file per process, "<family>.<entry> <calls>" per entry; src/distjax/tensor/table/
# coverage.cpp) and fails naming every entry nothing called.
# UNREACHABLE: entries this build has nothing to call with (host staging without MPI).
#   cmake -DDIR=<dir of kernels.*.txt> [-DUNREACHABLE=a;b] -P kernel_coverage.cmake
cmake_policy(SET CMP0057 NEW)
file(GLOB files "${DIR}/kernels.*.txt")
if(NOT files)
  message(FATAL_ERROR "no coverage counts in ${DIR}: the coverage runs wrote nothing")
endif()
set(entries)
foreach(f ${files})
  file(STRINGS "${f}" lines)
  foreach(line ${lines})
    string(REPLACE " " ";" parts "${line}")
    list(GET parts 0 entry)
    list(GET parts 1 calls)
    list(APPEND entries ${entry})
    if(NOT DEFINED calls_${entry})
      set(calls_${entry} 0)
    endif()
    math(EXPR calls_${entry} "${calls_${entry}} + ${calls}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES entries)
list(SORT entries)
set(uncalled)
foreach(entry ${entries})
  if(calls_${entry} EQUAL 0 AND NOT entry IN_LIST UNREACHABLE)
    list(APPEND uncalled ${entry})
  endif()
endforeach()
list(LENGTH entries n)
list(LENGTH files runs)
if(uncalled)
  string(REPLACE ";" ", " uncalled "${uncalled}")
  message(FATAL_ERROR "kernel-table entries no op test calls (of ${n}, over ${runs} runs): "
                      "${uncalled}. Test them, or leave the entry null where nothing can "
                      "call it.")
endif()
message(STATUS "all ${n} non-null CPU kernel-table entries called (${runs} test processes)")
