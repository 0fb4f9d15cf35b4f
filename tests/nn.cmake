# nn: end-to-end test of `dtrain sample` (needs the dtrain binary).
add_executable(test_sample_e2e ${CMAKE_CURRENT_SOURCE_DIR}/nn/sample_e2e.c)
target_include_directories(test_sample_e2e PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                           ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_sample_e2e PRIVATE _GNU_SOURCE)
target_link_libraries(test_sample_e2e PRIVATE dtrain)
add_dependencies(test_sample_e2e dtrain_cli)
add_test(NAME test_sample_e2e COMMAND test_sample_e2e $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_sample_e2e PROPERTIES TIMEOUT 300 LABELS "unit")

# The bf16/fp16 GPT with the 16-bit kernels forced onto lower ISA levels
# (oneDNN's level is fixed once per process, hence separate runs): the
# PyTorch fixtures within the 16-bit tolerances, and recomputation still
# bit-identical. A level above the CPU's exits 77 (skipped).
foreach(isa scalar avx2)
  add_test(NAME test_gpt_reference_isa_${isa} COMMAND test_gpt_reference)
  add_test(NAME test_gpt_mp_isa_${isa} COMMAND test_gpt_mp)
  set_tests_properties(test_gpt_reference_isa_${isa} test_gpt_mp_isa_${isa} PROPERTIES
                       TIMEOUT 300 LABELS "unit" SKIP_RETURN_CODE 77
                       ENVIRONMENT "DT_ISA=${isa};OMP_WAIT_POLICY=passive")
endforeach()
set_tests_properties(test_gpt_mp test_gpt_reference PROPERTIES
                     ENVIRONMENT "OMP_WAIT_POLICY=passive")

# `dtrain bench train` runs modes side by side (tiny sizes) and names a bad mode.
add_test(NAME cli_bench_train_modes
         COMMAND dtrain_cli bench train --model tiny --batch 2 --seq 16 --threads 2 --steps 1
                 --warmup 0 --precision fp32,bf16 --recompute none,every:2)
set_tests_properties(cli_bench_train_modes PROPERTIES TIMEOUT 120 LABELS "unit"
                     ENVIRONMENT "OMP_WAIT_POLICY=passive"
                     PASS_REGULAR_EXPRESSION "tiny +2 +16 +2 +bf16 +every:2 ")
add_test(NAME cli_bench_train_bad_mode COMMAND dtrain_cli bench train --recompute every:0)
set_tests_properties(cli_bench_train_bad_mode PROPERTIES TIMEOUT 60 LABELS "unit"
                     PASS_REGULAR_EXPRESSION "--recompute 'every:0': expected none, blocks")
