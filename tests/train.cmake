# Tests of the train layer that need special registration.

# A full disk: mounts a small tmpfs in a private mount namespace; exits 77
# (skipped) without the privilege to do so.
add_executable(test_ckpt_disk_full ${CMAKE_CURRENT_SOURCE_DIR}/train/test_ckpt_disk_full.c)
target_include_directories(test_ckpt_disk_full PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_ckpt_disk_full PRIVATE _GNU_SOURCE)
target_link_libraries(test_ckpt_disk_full PRIVATE dtrain)
add_test(NAME test_ckpt_disk_full COMMAND test_ckpt_disk_full)
set_tests_properties(test_ckpt_disk_full PROPERTIES TIMEOUT 60 LABELS "train"
                     SKIP_RETURN_CODE 77)

# `dtrain ckpt info` run as a real command on files the test writes.
add_executable(test_ckpt_info ${CMAKE_CURRENT_SOURCE_DIR}/train/test_ckpt_info.c)
target_include_directories(test_ckpt_info PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_ckpt_info PRIVATE _GNU_SOURCE
                           DT_CLI_PATH="$<TARGET_FILE:dtrain_cli>")
target_link_libraries(test_ckpt_info PRIVATE dtrain)
add_dependencies(test_ckpt_info dtrain_cli)
add_test(NAME test_ckpt_info COMMAND test_ckpt_info)
set_tests_properties(test_ckpt_info PROPERTIES TIMEOUT 60 LABELS "train")

# --config FILE in the CLI's flag parser (compiled in directly).
add_executable(test_cli_config ${CMAKE_CURRENT_SOURCE_DIR}/train/test_cli_config.c
                               ${PROJECT_SOURCE_DIR}/src/cli/args.c)
target_include_directories(test_cli_config PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                                                   ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_cli_config PRIVATE _GNU_SOURCE)
target_link_libraries(test_cli_config PRIVATE dtrain)
add_test(NAME test_cli_config COMMAND test_cli_config)
set_tests_properties(test_cli_config PROPERTIES TIMEOUT 60 LABELS "train")

# `dtrain train` end to end, one rank: bad input, NaN, mismatch, --config,
# bit-identical resume, SIGKILL + resume.
add_executable(test_train_cli ${CMAKE_CURRENT_SOURCE_DIR}/train/test_train_cli.c)
target_include_directories(test_train_cli PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_train_cli PRIVATE _GNU_SOURCE
                           DT_CLI_PATH="$<TARGET_FILE:dtrain_cli>")
target_link_libraries(test_train_cli PRIVATE dtrain)
add_dependencies(test_train_cli dtrain_cli)
add_test(NAME test_train_cli COMMAND test_train_cli)
set_tests_properties(test_train_cli PROPERTIES TIMEOUT 120 LABELS "train")

# Data-parallel training with real processes, one case per ctest entry.
add_executable(test_train_ddp ${CMAKE_CURRENT_SOURCE_DIR}/train/test_train_ddp.c)
target_include_directories(test_train_ddp PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_train_ddp PRIVATE _GNU_SOURCE
                           DT_CLI_PATH="$<TARGET_FILE:dtrain_cli>")
target_link_libraries(test_train_ddp PRIVATE dtrain)
add_dependencies(test_train_ddp dtrain_cli)
foreach(case equiv accum resume restart sigterm check divisible)
  add_test(NAME test_train_ddp_${case} COMMAND test_train_ddp ${case})
  set_tests_properties(test_train_ddp_${case} PROPERTIES TIMEOUT 180 LABELS "train;multiprocess")
endforeach()
