# data layer: the `dtrain data` command end to end (exit codes and messages).
add_test(NAME cli_data COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/data_cli.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(cli_data PROPERTIES TIMEOUT 60 LABELS "unit")
# A full disk (a tmpfs in a private namespace): clear error, previous file kept.
add_test(NAME cli_data_full_disk
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/data_full_disk.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(cli_data_full_disk PROPERTIES TIMEOUT 60 LABELS "unit" SKIP_RETURN_CODE 77)
