# amp: test_amp_gemm again under each forced ISA level, so that oneDNN's
# fallbacks (whose ISA is fixed once per process) run too. A level above the
# CPU's exits 77 and is reported as skipped.
foreach(isa scalar avx2 avx512 avx512bf16)
  add_test(NAME test_amp_gemm_isa_${isa} COMMAND test_amp_gemm)
  set_tests_properties(test_amp_gemm_isa_${isa} PROPERTIES TIMEOUT 300 LABELS "unit"
                       ENVIRONMENT "DT_ISA=${isa}" SKIP_RETURN_CODE 77)
endforeach()
