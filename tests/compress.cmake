# compress: `dtrain bench compress` end to end on a small tensor, every
# codec, one timed run (a smoke test of the CLI path; speed is not checked).
add_test(NAME compress_bench_smoke
         COMMAND dtrain_cli bench compress --count 100003 --rows 1 --iters 1 --json)
set_tests_properties(compress_bench_smoke PROPERTIES
                     TIMEOUT 60 LABELS "unit"
                     FAIL_REGULAR_EXPRESSION "error:")
add_test(NAME compress_bench_powersgd
         COMMAND dtrain_cli bench compress --codec powersgd:2 --count 65536 --iters 1)
set_tests_properties(compress_bench_powersgd PROPERTIES
                     TIMEOUT 60 LABELS "unit"
                     FAIL_REGULAR_EXPRESSION "error:")
# A bad spec is refused: exit code 2 and a message naming the knob and value.
add_test(NAME compress_bench_bad_codec
         COMMAND sh -c "out=$(\"$0\" bench compress --codec topk:2.5 --count 1000 2>&1); rc=$?; \
echo \"$out\"; [ $rc -eq 2 ] && echo \"$out\" | grep -q 'codec: .topk:2.5.: fraction'"
                 $<TARGET_FILE:dtrain_cli>)
set_tests_properties(compress_bench_bad_codec PROPERTIES
                     TIMEOUT 30 LABELS "unit")

# The compressed allreduce with real processes (tests/compress/*.c, using
# the comm harness): every codec at 2, 3 and 4 ranks against a serial
# reference, mass conservation, and corrupt peer buffers.
add_executable(test_compress_coll ${CMAKE_CURRENT_SOURCE_DIR}/compress/test_compress_coll.c)
target_include_directories(test_compress_coll PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                           ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_compress_coll PRIVATE _GNU_SOURCE)
target_link_libraries(test_compress_coll PRIVATE dtrain)
foreach(case coll_2 coll_3 coll_4 nonfinite nonfinite_4 corrupt corrupt_4)
  add_test(NAME compress_${case} COMMAND test_compress_coll ${case})
  set_tests_properties(compress_${case} PROPERTIES TIMEOUT 180 LABELS "compress;multiprocess")
endforeach()
