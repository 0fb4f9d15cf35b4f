# The dtrain command as a user meets it (issue 19's defects), one ctest
# entry per case: tests/cli_usability.sh DTRAIN SRC CASE.
foreach(case demo_steps run_dir tokenizer_default model_paths mfu_peak buckets flags config_json
             torchrun warnings errors help zero3_files)
  add_test(NAME cli_usability_${case}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli_usability.sh $<TARGET_FILE:dtrain_cli>
                   ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(cli_usability_${case} PROPERTIES TIMEOUT 180 LABELS "unit")
endforeach()
set_tests_properties(cli_usability_buckets cli_usability_torchrun cli_usability_errors
                     cli_usability_zero3_files
                     PROPERTIES LABELS "unit;multiprocess")

# The README's Usage section, run as written with small step counts.
add_test(NAME readme_usage
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/readme_usage.sh ${CMAKE_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(readme_usage PROPERTIES TIMEOUT 600 LABELS "unit;multiprocess")

# docs/config.md lists every option of every command, and no removed one.
add_test(NAME docs_config COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/docs_config.sh
                                  $<TARGET_FILE:dtrain_cli> ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_config PROPERTIES TIMEOUT 60 LABELS "unit")
