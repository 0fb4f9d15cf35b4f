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

# The planner (docs/planner.md): a search on a cluster file ranks layouts
# and says why the others were pruned; --json carries the layout and the
# predictions; a bad cluster file is refused naming the field (exit 2); the
# planner's memory for a layout is `plan memory`'s (the trainer's plan); and
# the published large-scale runs it is calibrated and checked against stay
# within 10% (bench/planner-published.sh --check).
add_test(NAME cli_plan_search
         COMMAND dtrain_cli plan --model gpt2-350m --global-batch 512 --devices 64
                 --cluster ${PROJECT_SOURCE_DIR}/examples/clusters/dgx-a100.json --top 3 --timeline)
set_tests_properties(cli_plan_search PROPERTIES TIMEOUT 60 LABELS "parallel"
                     PASS_REGULAR_EXPRESSION "searched: [0-9]+ layouts in [0-9.]+ s: [0-9]+ fit(.|\n)*1    dp [0-9]+ x tp(.|\n)*pruned \\(count, reason(.|\n)*predicted step")
# The JSON of a 1024-GPU search: ranked, the layout covers the devices. Its
# wall time is bounded loosely (5 s; it takes ~0.4 s alone, ~1 s beside
# other tests; under a sanitizer only the answer is checked, not the time):
# bench/planner.sh and docs/planner.md report the speed.
if(DT_SANITIZE)
  set(plan_json_seconds 600)
else()
  set(plan_json_seconds 5)
endif()
add_test(NAME cli_plan_json
         COMMAND sh -c "$<TARGET_FILE:dtrain_cli> plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 --global-batch 1536 --devices 1024 --cluster ${PROJECT_SOURCE_DIR}/examples/clusters/dgx-a100.json --precision fp16 --json --top 2 | python3 -c 'import json,sys; r=json.load(sys.stdin); c=r[\"candidates\"]; assert len(c)==2 and c[0][\"step_s\"]<=c[1][\"step_s\"], c; l=c[0][\"layout\"]; assert l[\"dp\"]*l[\"tp\"]*l[\"pp\"]*l[\"cp\"]==1024, l; assert r[\"seconds\"]<${plan_json_seconds}, r[\"seconds\"]; assert r[\"pruned\"]; print(\"ok\", l, r[\"seconds\"])'")
set_tests_properties(cli_plan_json PROPERTIES TIMEOUT 60 LABELS "parallel" PASS_REGULAR_EXPRESSION "^ok ")
file(WRITE ${CMAKE_BINARY_DIR}/bad_cluster.json "{\"devices_per_node\": 8, \"device\": {\"memory_gib\": 80, \"memory_bw_gbs\": 2000, \"peak_tflops\": {\"bf16\": -3}}, \"intra\": {\"bw_gbs\": 300}}")
add_test(NAME cli_plan_bad_cluster
         COMMAND sh -c "$<TARGET_FILE:dtrain_cli> plan --devices 8 --cluster ${CMAKE_BINARY_DIR}/bad_cluster.json; echo exit=$?")
set_tests_properties(cli_plan_bad_cluster PROPERTIES TIMEOUT 60 LABELS "parallel"
                     PASS_REGULAR_EXPRESSION "device.peak_tflops.bf16 = -3: expected 0..1e\\+06(.|\n)*exit=2")
add_test(NAME cli_plan_memory_agrees
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/plan_memory.sh $<TARGET_FILE:dtrain_cli> ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_plan_memory_agrees PROPERTIES TIMEOUT 60 LABELS "parallel" PASS_REGULAR_EXPRESSION "all passed")
# dtrain train --layout auto runs what dtrain plan ranks first (launcher,
# fixed flags, external launcher, nothing fits).
add_test(NAME cli_train_layout_auto
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/train_layout_auto.sh $<TARGET_FILE:dtrain_cli> ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_train_layout_auto PROPERTIES TIMEOUT 180 LABELS "parallel;multiprocess"
                     PASS_REGULAR_EXPRESSION "all passed")
add_test(NAME plan_published_runs
         COMMAND sh ${PROJECT_SOURCE_DIR}/bench/planner-published.sh $<TARGET_FILE:dtrain_cli> --check)
set_tests_properties(plan_published_runs PROPERTIES TIMEOUT 120 LABELS "parallel")
