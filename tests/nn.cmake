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
