# Tests of the train layer that need special registration.

# One test program from train/NAME.c; with CLI, it runs the dtrain binary
# (DT_CLI_PATH) and is built after it.
function(dt_train_test_exe name)
  add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/train/${name}.c ${ARGN})
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
  target_link_libraries(${name} PRIVATE dtrain)
endfunction()

function(dt_train_cli_test_exe name)
  dt_train_test_exe(${name})
  target_compile_definitions(${name} PRIVATE DT_CLI_PATH="$<TARGET_FILE:dtrain_cli>")
  add_dependencies(${name} dtrain_cli)
endfunction()

# A full disk: mounts a small tmpfs in a private mount namespace; exits 77
# (skipped) without the privilege to do so.
dt_train_test_exe(test_ckpt_disk_full)
add_test(NAME test_ckpt_disk_full COMMAND test_ckpt_disk_full)
set_tests_properties(test_ckpt_disk_full PROPERTIES TIMEOUT 60 LABELS "train"
                     SKIP_RETURN_CODE 77)

# `dtrain ckpt info` run as a real command on files the test writes.
dt_train_cli_test_exe(test_ckpt_info)
add_test(NAME test_ckpt_info COMMAND test_ckpt_info)
set_tests_properties(test_ckpt_info PROPERTIES TIMEOUT 60 LABELS "train")

# --config FILE in the CLI's flag parser (compiled in directly).
dt_train_test_exe(test_cli_config ${PROJECT_SOURCE_DIR}/src/cli/args.c)
target_include_directories(test_cli_config PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(test_cli_config PRIVATE PkgConfig::JANSSON)
add_test(NAME test_cli_config COMMAND test_cli_config)
set_tests_properties(test_cli_config PROPERTIES TIMEOUT 60 LABELS "train")

# `dtrain train` end to end, one rank: bad input, NaN, mismatch, --config,
# bit-identical resume, SIGKILL + resume.
dt_train_cli_test_exe(test_train_cli)
add_test(NAME test_train_cli COMMAND test_train_cli)
set_tests_properties(test_train_cli PROPERTIES TIMEOUT 120 LABELS "train")

# Data-parallel training with real processes, one case per ctest entry.
dt_train_cli_test_exe(test_train_ddp)
foreach(case equiv accum resume restart sigterm check divisible deterministic)
  add_test(NAME test_train_ddp_${case} COMMAND test_train_ddp ${case})
  set_tests_properties(test_train_ddp_${case} PROPERTIES TIMEOUT 180 LABELS "train;multiprocess")
endforeach()
# Two launchers on loopback pick a port themselves.
set_tests_properties(test_train_ddp_deterministic PROPERTIES RESOURCE_LOCK launch_ports)

# Mixed precision in `dtrain train` with real processes: loss-scaler overflow
# handling agreed across ranks, and bf16/fp16 validation loss against fp32.
dt_train_cli_test_exe(test_train_amp)
foreach(case overflow precision)
  add_test(NAME test_train_amp_${case} COMMAND test_train_amp ${case})
  set_tests_properties(test_train_amp_${case} PROPERTIES TIMEOUT 180 LABELS "train;multiprocess")
endforeach()

# Compressed and 16-bit gradient communication in `dtrain train`, 2 ranks.
dt_train_cli_test_exe(test_train_compress)
foreach(case topk powersgd bf16 resume config warmup freeze dense ramp)
  add_test(NAME test_train_compress_${case} COMMAND test_train_compress ${case})
  set_tests_properties(test_train_compress_${case} PROPERTIES TIMEOUT 180
                       LABELS "train;multiprocess")
endforeach()
# The DDP codec worker thread under `make tsan`.
set_tests_properties(test_train_compress_topk PROPERTIES LABELS "train;multiprocess;tsan")

# --isa: a bad level is refused naming the flag and the value; a lower level
# trains in bf16 through the fallback kernels.
add_test(NAME cli_train_bad_isa COMMAND dtrain_cli train --data ${CMAKE_SOURCE_DIR}/README.md --isa foo)
set_tests_properties(cli_train_bad_isa PROPERTIES TIMEOUT 60 LABELS "unit"
                     PASS_REGULAR_EXPRESSION "--isa: \"foo\" is not one of scalar")
add_test(NAME cli_train_isa_avx2_bf16
         COMMAND dtrain_cli train --data ${CMAKE_SOURCE_DIR}/README.md --isa avx2 --precision bf16
                 --steps 3 --sample-tokens 0 --progress plain)
set_tests_properties(cli_train_isa_avx2_bf16 PROPERTIES TIMEOUT 120 LABELS "unit"
                     PASS_REGULAR_EXPRESSION "kernels avx2(.|\n)*done: steps 1\\.\\.3 .*bf16")

# Tensor and sequence parallelism in `dtrain train`: equivalence with one
# rank, resharding checkpoints across layouts, the old checkpoint format,
# bad layouts.
dt_train_cli_test_exe(test_train_tp)
foreach(case equiv_tp2 equiv_tp4 equiv_dp2tp2 reshard format1 layouts info)
  add_test(NAME test_train_tp_${case} COMMAND test_train_tp ${case})
  set_tests_properties(test_train_tp_${case} PROPERTIES TIMEOUT 300 LABELS "train;multiprocess")
endforeach()

# Pipeline-parallel training against one rank: every schedule at 2, 3 and 4
# stages, with dp, tp, bf16 and recomputation; resuming across layouts;
# activation memory and live micro-batches of 1F1B against GPipe; a stage
# killed mid-step; bad settings.
dt_train_cli_test_exe(test_train_pp)
foreach(case equiv_pp2 equiv_pp3 equiv_pp4 equiv_mixed reshard memory kill errors)
  add_test(NAME test_train_pp_${case} COMMAND test_train_pp ${case})
  set_tests_properties(test_train_pp_${case} PROPERTIES TIMEOUT 600 LABELS "train;multiprocess")
endforeach()

# The optimizers of docs/optim.md in `dtrain train`: bit-identical resume of
# each, data-parallel against one rank, ZeRO 1 and 2 against DDP, 1-bit
# Adam's compression stage, context parallelism against one rank, every
# optimizer flag through config.json and back, bad combinations.
dt_train_cli_test_exe(test_train_optim)
foreach(case resume ddp zero zero3 cp config offload onebit errors)
  add_test(NAME test_train_optim_${case} COMMAND test_train_optim ${case})
  set_tests_properties(test_train_optim_${case} PROPERTIES TIMEOUT 300
                       LABELS "train;multiprocess")
endforeach()

# ZeRO stages 1 and 2 against DDP: bit-identical where the reduction order
# is, resumed across stages and dp sizes, memory measured against the plan.
dt_train_cli_test_exe(test_train_zero)
foreach(case equiv resume memory offload compress params errors)
  add_test(NAME test_train_zero_${case} COMMAND test_train_zero ${case})
  set_tests_properties(test_train_zero_${case} PROPERTIES TIMEOUT 600 LABELS "train;multiprocess")
endforeach()

# Context parallelism (Ulysses and ring attention) against one rank,
# resumed across layouts, and the layouts it refuses.
dt_train_cli_test_exe(test_train_cp)
foreach(case equiv resume errors)
  add_test(NAME test_train_cp_${case} COMMAND test_train_cp ${case})
  set_tests_properties(test_train_cp_${case} PROPERTIES TIMEOUT 600 LABELS "train;multiprocess")
endforeach()

# --dp-mode local and gossip (docs/async.md) against DDP: bit-identical
# where they must be, within a stated loss tolerance at equal samples,
# bytes per step constant in the ranks, resumed bit-identically.
dt_train_cli_test_exe(test_train_async)
foreach(case local_equiv local_loss local_resume gossip_equiv gossip_bytes errors slow
             ps_train ps_delay ps_fault)
  add_test(NAME test_train_async_${case} COMMAND test_train_async ${case})
  set_tests_properties(test_train_async_${case} PROPERTIES TIMEOUT 300
                       LABELS "train;multiprocess")
endforeach()

# Weights interop: safetensors and llm.c's format against the PyTorch
# reference (skipped, 77, without python3-torch).
dt_train_test_exe(logits_dump)
add_test(NAME interop_safetensors
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/interop_safetensors.sh $<TARGET_FILE:dtrain_cli>
                 $<TARGET_FILE:logits_dump> ${PROJECT_SOURCE_DIR})
set_tests_properties(interop_safetensors PROPERTIES TIMEOUT 180 LABELS "train" SKIP_RETURN_CODE 77)

# The optimizer state offloaded to disk: a full disk (a tmpfs in a private
# namespace) and a rank killed mid-stream.
add_test(NAME cli_train_offload_disk
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/train_offload_disk.sh $<TARGET_FILE:dtrain_cli>
                 ${PROJECT_SOURCE_DIR}/README.md)
set_tests_properties(cli_train_offload_disk PROPERTIES TIMEOUT 300 LABELS "train;multiprocess"
                     SKIP_RETURN_CODE 77)
