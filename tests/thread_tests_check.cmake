# ThreadTests.FilterSelectsTheSameTests (tests/CMakeLists.txt): the TSan filter lists the same tests
# from qkv_thread_tests (the threaded files only) as from qkv_tests (every file), and some.
foreach(exe ALL THREADED)
  execute_process(COMMAND ${${exe}} --gtest_list_tests --gtest_filter=${FILTER}
    OUTPUT_VARIABLE list_${exe} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${${exe}} --gtest_list_tests failed (${status})")
  endif()
endforeach()
if(NOT list_ALL STREQUAL list_THREADED)
  message(FATAL_ERROR "the TSan filter selects different tests from qkv_tests:\n${list_ALL}\n"
    "and from qkv_thread_tests:\n${list_THREADED}\nadd the file that defines them to QKV_THREAD_TEST_FILES")
endif()
string(REGEX MATCHALL "\n  [^\n]+" cases "${list_ALL}")
list(LENGTH cases n)
if(n EQUAL 0)
  message(FATAL_ERROR "the TSan filter ${FILTER} selects no test")
endif()
message(STATUS "the TSan filter selects the same ${n} tests from both")
