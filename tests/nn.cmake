# nn: end-to-end test of `dtrain sample` (needs the dtrain binary).
add_executable(test_sample_e2e ${CMAKE_CURRENT_SOURCE_DIR}/nn/sample_e2e.c)
target_include_directories(test_sample_e2e PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                           ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_sample_e2e PRIVATE _GNU_SOURCE)
target_link_libraries(test_sample_e2e PRIVATE dtrain)
add_dependencies(test_sample_e2e dtrain_cli)
add_test(NAME test_sample_e2e COMMAND test_sample_e2e $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_sample_e2e PROPERTIES TIMEOUT 300 LABELS "unit")
