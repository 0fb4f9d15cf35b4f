# Multi-process tests of the parallel layer (tests/parallel/*.c, each its own
# program that fork/execs its ranks on loopback through comm/harness.h).
function(dt_parallel_test_exe name)
  add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/parallel/${name}.c)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
  target_link_libraries(${name} PRIVATE dtrain)
endfunction()

# The device mesh: the formula for every axis order, and 8 real ranks.
dt_parallel_test_exe(test_mesh)
add_test(NAME test_mesh COMMAND test_mesh)
set_tests_properties(test_mesh PROPERTIES TIMEOUT 300 LABELS "parallel;multiprocess")

# A tensor-parallel shard of the GPT (with and without sequence parallelism,
# fp32 and bf16, recomputation) against the whole model, 2 and 4 ranks.
dt_parallel_test_exe(test_gpt_tp)
foreach(n 2 4)
  add_test(NAME test_gpt_tp_${n} COMMAND test_gpt_tp tp_${n})
  set_tests_properties(test_gpt_tp_${n} PROPERTIES TIMEOUT 300 LABELS "parallel;multiprocess")
endforeach()

# A context-parallel part of the GPT (Ulysses and ring attention, fp32 and
# bf16, recomputation) against the whole model, 2 and 4 ranks.
dt_parallel_test_exe(test_gpt_cp)
foreach(n 2 4)
  add_test(NAME test_gpt_cp_${n} COMMAND test_gpt_cp cp_${n})
  set_tests_properties(test_gpt_cp_${n} PROPERTIES TIMEOUT 300 LABELS "parallel;multiprocess")
endforeach()

# Pipeline schedules planned from the command line: a checked table, the
# simulated bubble against the theory, and a refused combination.
add_test(NAME cli_plan_pipeline
         COMMAND dtrain_cli plan pipeline --stages 4 --micro-batches 8 --schedule interleaved:2
                 --model shakespeare-char --layers 8 --table --svg plan_pipeline.svg)
set_tests_properties(cli_plan_pipeline PROPERTIES TIMEOUT 60 LABELS "parallel"
                     PASS_REGULAR_EXPRESSION "check:    ok(.|\n)*bubble:   15.8% simulated(.|\n)*theory 15.8%(.|\n)*rank 0   live micro-batches 11 (.|\n)*svg:      plan_pipeline.svg")
add_test(NAME cli_plan_pipeline_refused
         COMMAND dtrain_cli plan pipeline --stages 4 --micro-batches 6 --schedule interleaved:2)
set_tests_properties(cli_plan_pipeline_refused PROPERTIES TIMEOUT 60 LABELS "parallel"
                     WILL_FAIL TRUE)

# The pipeline executor: every schedule kind at 2, 3 and 4 stages against
# the whole model in one process (losses and gradients bit for bit but the
# tied embedding's, peak live micro-batches as predicted, evaluation), and
# ranks given different schedules refused at start.
dt_parallel_test_exe(test_pipeline_run)
foreach(n 2 3 4)
  add_test(NAME test_pipeline_run_${n} COMMAND test_pipeline_run pp_${n})
  set_tests_properties(test_pipeline_run_${n} PROPERTIES TIMEOUT 300 LABELS "parallel;multiprocess;tsan")
endforeach()
