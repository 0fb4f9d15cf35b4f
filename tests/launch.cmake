# Launcher tests: real `dtrain launch` runs with the probe program as ranks.
# Each named case of tests/launch/test_launch.c is its own ctest test.

# A collective check that runs the same under dtrain launch, mpirun and
# across network namespaces (public comm API only).
add_executable(launch_coll_check ${CMAKE_CURRENT_SOURCE_DIR}/launch/coll_check.c)
target_link_libraries(launch_coll_check PRIVATE dtrain)
add_executable(launch_probe ${CMAKE_CURRENT_SOURCE_DIR}/launch/probe.c)
add_executable(launch_selfexec ${CMAKE_CURRENT_SOURCE_DIR}/launch/selfexec.c)
target_link_libraries(launch_selfexec PRIVATE dtrain)
add_executable(test_launch ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_launch.c)
target_include_directories(test_launch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_launch PRIVATE _GNU_SOURCE
  DT_CLI="$<TARGET_FILE:dtrain_cli>"
  PROBE="$<TARGET_FILE:launch_probe>"
  SELFEXEC="$<TARGET_FILE:launch_selfexec>"
  COLL="$<TARGET_FILE:launch_coll_check>")
target_link_libraries(test_launch PRIVATE dtrain)
# Captured outputs are large; messages quoting them are cut on purpose.
target_compile_options(test_launch PRIVATE -Wno-format-truncation)
add_dependencies(test_launch dtrain_cli launch_probe launch_selfexec launch_coll_check)

foreach(t env tag_output untagged_output fail fail_signal fail_grace sigint sigterm restart no_orphans
          launcher_killed bad_input port_in_use unreachable_master two_nodes
          two_nodes_mismatch two_nodes_fail two_nodes_missing two_nodes_restart two_nodes_slow
          two_nodes_sigint self comm_one_node comm_two_nodes bench_np)
  add_test(NAME launch_${t} COMMAND test_launch ${t})
  set_tests_properties(launch_${t} PROPERTIES TIMEOUT 60 LABELS "launch")
endforeach()
# Tests that pick TCP ports themselves must not race each other for them.
set_tests_properties(launch_port_in_use launch_unreachable_master launch_two_nodes
                     launch_two_nodes_mismatch launch_two_nodes_fail launch_two_nodes_missing
                     launch_two_nodes_restart launch_two_nodes_slow launch_two_nodes_sigint
                     launch_comm_two_nodes
                     PROPERTIES RESOURCE_LOCK launch_ports)

# Two hosts made of network namespaces (scripts/netns-cluster.sh): needs
# root and iproute2, skipped with a message otherwise.
add_test(NAME launch_netns
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/netns_launch.sh
                 $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:launch_probe>
                 $<TARGET_FILE:launch_coll_check>)
set_tests_properties(launch_netns PROPERTIES TIMEOUT 60 LABELS "launch;netns"
                     SKIP_RETURN_CODE 77)

# The srun path without a cluster: processes with exactly srun's variables.
add_test(NAME launch_fake_slurm
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/fake_slurm.sh $<TARGET_FILE:launch_coll_check>)
set_tests_properties(launch_fake_slurm PROPERTIES TIMEOUT 60 LABELS "launch"
                     RESOURCE_LOCK launch_ports)

# Under a real mpirun, ranks find themselves from Open MPI's variables.
find_program(DT_MPIRUN mpirun)
add_executable(launch_jobenv_print ${CMAKE_CURRENT_SOURCE_DIR}/launch/jobenv_print.c)
target_include_directories(launch_jobenv_print PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(launch_jobenv_print PRIVATE dtrain)
if(DT_MPIRUN)
  add_test(NAME launch_mpirun_env
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/mpirun_jobenv.sh ${DT_MPIRUN}
                   $<TARGET_FILE:launch_jobenv_print>)
  set_tests_properties(launch_mpirun_env PROPERTIES TIMEOUT 60 LABELS "launch;mpi")
endif()

# With Open MPI built in (src/comm/deps.cmake): comm's collective suite,
# its abort and point-to-point cases, and coll_check under `mpirun` with
# DT_BACKEND=mpi, the native backend
# bootstrapped through MPI, and a failing rank under both. Open MPI's own
# allocations upset LeakSanitizer: "noasan".
if(DT_MPIRUN AND TARGET MPI::MPI_C)
  set(mpirun_args ${DT_MPIRUN} --oversubscribe --allow-run-as-root)
  add_test(NAME launch_mpi_sweep
           COMMAND ${mpirun_args} -np 4 -x DT_BACKEND=mpi -x DT_TIMEOUT=60
                   $<TARGET_FILE:test_comm_sweep> --child shm_4)
  add_test(NAME launch_mpi_sweep_odd
           COMMAND ${mpirun_args} -np 3 -x DT_BACKEND=mpi -x DT_TIMEOUT=60
                   $<TARGET_FILE:test_comm_sweep> --child shm_3)
  add_test(NAME launch_mpi_abort
           COMMAND ${mpirun_args} -np 2 -x DT_BACKEND=mpi -x DT_TIMEOUT=30
                   $<TARGET_FILE:test_comm_groups> --child abort_shm_2)
  add_test(NAME launch_mpi_p2p
           COMMAND ${mpirun_args} -np 5 -x DT_BACKEND=mpi -x DT_TIMEOUT=30
                   $<TARGET_FILE:test_comm_groups> --child p2p_shm_5)
  add_test(NAME launch_mpi_coll
           COMMAND ${mpirun_args} -np 4 -x DT_BACKEND=mpi
                   $<TARGET_FILE:launch_coll_check> --expect-backend mpi --expect-transport mpi)
  add_test(NAME launch_mpi_native
           COMMAND ${mpirun_args} -np 3 $<TARGET_FILE:launch_coll_check>
                   --expect-backend native --expect-transport shm)
  add_test(NAME launch_mpi_fail
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/mpirun_fail.sh ${DT_MPIRUN}
                   $<TARGET_FILE:launch_coll_check>)
  set_tests_properties(launch_mpi_sweep launch_mpi_sweep_odd launch_mpi_abort launch_mpi_p2p
                       launch_mpi_coll launch_mpi_native launch_mpi_fail
                       PROPERTIES TIMEOUT 120 LABELS "launch;mpi;noasan")
endif()
