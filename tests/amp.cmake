# amp: test_amp_gemm again under each forced ISA level, so that oneDNN's
# fallbacks (whose ISA is fixed once per process) run too. A level above the
# CPU's exits 77 and is reported as skipped.
# OMP_WAIT_POLICY=passive: idle OpenMP workers sleep instead of spinning, so
# tests that ctest runs side by side on a 2-core machine do not starve each
# other.
foreach(isa scalar avx2 avx512 avx512bf16)
  add_test(NAME test_amp_gemm_isa_${isa} COMMAND test_amp_gemm)
  set_tests_properties(test_amp_gemm_isa_${isa} PROPERTIES TIMEOUT 300 LABELS "unit"
                       ENVIRONMENT "DT_ISA=${isa};OMP_WAIT_POLICY=passive" SKIP_RETURN_CODE 77)
endforeach()
set_tests_properties(test_amp_gemm test_amp_convert test_amp_scaler PROPERTIES
                     ENVIRONMENT "OMP_WAIT_POLICY=passive")

# The benchmarks run (tiny sizes), and a bad DT_ISA stops them with its message.
add_test(NAME cli_bench_gemm_bf16
         COMMAND dtrain_cli bench gemm-bf16 --shapes 33x17x9,1x1x1 --op layer --runs 3
                 --min-time 0 --backends ref,onednn,openblas,avx512,amx,sgemm,f16)
set_tests_properties(cli_bench_gemm_bf16 PROPERTIES TIMEOUT 120 LABELS "unit"
                     ENVIRONMENT "OMP_WAIT_POLICY=passive"
                     PASS_REGULAR_EXPRESSION "17 +9 +33 +tn +f16-sgemm")
add_test(NAME cli_bench_amp_convert COMMAND dtrain_cli bench amp-convert --count 1000 --runs 3)
set_tests_properties(cli_bench_amp_convert PROPERTIES TIMEOUT 120 LABELS "unit"
                     PASS_REGULAR_EXPRESSION "unscale")
add_test(NAME cli_bench_bad_isa COMMAND dtrain_cli bench gemm-bf16 --shapes 8x8x8)
set_tests_properties(cli_bench_bad_isa PROPERTIES TIMEOUT 60 LABELS "unit"
                     ENVIRONMENT "DT_ISA=avx9"
                     PASS_REGULAR_EXPRESSION "DT_ISA: \"avx9\" is not one of scalar")

# test_act16 walks the ISA levels down itself; this run fixes oneDNN at
# avx512bf16 so its non-AMX bf16 kernels serve the 16-bit linear layers too.
add_test(NAME test_act16_isa_avx512bf16 COMMAND test_act16)
set_tests_properties(test_act16_isa_avx512bf16 PROPERTIES TIMEOUT 300 LABELS "unit"
                     ENVIRONMENT "DT_ISA=avx512bf16;OMP_WAIT_POLICY=passive" SKIP_RETURN_CODE 77)
set_tests_properties(test_act16 PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive")

# `dtrain bench act16` runs through every kernel pair on a tiny model.
add_test(NAME cli_bench_act16
         COMMAND dtrain_cli bench act16 --model tiny --batch 2 --seq 16 --runs 3 --min-time 0
                 --precision fp16)
set_tests_properties(cli_bench_act16 PROPERTIES TIMEOUT 120 LABELS "unit"
                     ENVIRONMENT "OMP_WAIT_POLICY=passive"
                     PASS_REGULAR_EXPRESSION "lm head +1 .*total")
