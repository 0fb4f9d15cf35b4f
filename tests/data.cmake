# data layer: the `dtrain data` command end to end (exit codes and messages).
add_test(NAME cli_data COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/data_cli.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(cli_data PROPERTIES TIMEOUT 60 LABELS "unit")
