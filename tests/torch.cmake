# The PyTorch backend (bindings/torch): tests/torch/*.py under Debian's
# python3 (DT_TORCH_PYTHON), each case running its ranks as processes on
# loopback. Without python3-torch a test prints why and exits 77 (skipped);
# with python3-torch but no dtrain_torch built (libtorch-dev missing) it
# fails, naming the cause. Not registered when the backend is disabled or
# the build is sanitized (a sanitized extension cannot load into Python).
if(DT_TORCH_STATUS MATCHES "disabled|DT_SANITIZE")
  return()
endif()
set(torch_dir ${CMAKE_CURRENT_SOURCE_DIR}/torch)
set(torch_tests "")
macro(torch_test name timeout script)
  add_test(NAME torch_${name} COMMAND ${DT_TORCH_PYTHON} ${torch_dir}/${script} ${ARGN})
  set_tests_properties(torch_${name} PROPERTIES TIMEOUT ${timeout})
  list(APPEND torch_tests torch_${name})
endmacro()

foreach(n 1 2 3 4)                # every op x dtype x layout against gloo
  torch_test(ops_${n} 300 test_ops.py ops_${n})
endforeach()
torch_test(ops_3_tcp 300 test_ops.py ops_3)   # the same over TCP (as between hosts)
foreach(n 2 4)                    # DDP, no_sync and PowerSGD losses against gloo
  torch_test(ddp_${n} 300 test_ddp.py ddp_${n})
endforeach()
foreach(c unsupported mismatch killed timeout)
  torch_test(fail_${c} 120 test_fail.py ${c})
endforeach()
foreach(c env tcpstore filestore launch subgroup)
  torch_test(init_${c} 120 test_init.py ${c})
endforeach()
find_program(DT_MPIRUN mpirun)
if(DT_MPIRUN)
  torch_test(init_mpirun 120 test_init.py mpirun)
endif()

set_tests_properties(${torch_tests} PROPERTIES LABELS "torch;noasan" SKIP_RETURN_CODE 77
  ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;DT_TORCH_STATUS=${DT_TORCH_STATUS};DT_CLI=$<TARGET_FILE:dtrain_cli>;DT_MPIRUN=${DT_MPIRUN}")
set_property(TEST torch_ops_3_tcp APPEND PROPERTY ENVIRONMENT DT_TRANSPORT=tcp)
