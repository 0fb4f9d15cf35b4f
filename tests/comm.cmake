# Multi-process tests of the comm layer (tests/comm/*.c, each its own
# program that fork/execs its ranks on loopback). Labels: "comm"; the ones
# that exercise shared memory and the progress thread also "tsan".
foreach(prog test_comm_sweep test_comm_groups test_comm_fail test_comm_init test_comm_fuzz
             test_comm_det test_comm_elastic test_comm_mailbox)
  add_executable(${prog} ${CMAKE_CURRENT_SOURCE_DIR}/comm/${prog}.c)
  target_include_directories(${prog} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${prog} PRIVATE _GNU_SOURCE)
  target_link_libraries(${prog} PRIVATE dtrain)
endforeach()

add_test(NAME comm_sweep_shm COMMAND test_comm_sweep "shm_*")
add_test(NAME comm_sweep_tcp COMMAND test_comm_sweep "tcp_*")
add_test(NAME comm_sweep_hier COMMAND test_comm_sweep "hier_*")
add_test(NAME comm_sweep_torus COMMAND test_comm_sweep "torus_*" probe_hosts_4)
set_tests_properties(comm_sweep_shm comm_sweep_tcp comm_sweep_hier comm_sweep_torus PROPERTIES TIMEOUT 300
                     LABELS "comm")
target_link_libraries(test_comm_groups PRIVATE Threads::Threads)
add_test(NAME comm_groups COMMAND test_comm_groups)
set_tests_properties(comm_groups PROPERTIES TIMEOUT 300 LABELS "comm;tsan")
# Tagged messages and receives from any source (dt_mailbox): out of order,
# fan-in, mixed with the group's collectives and threads, every size class,
# shm and TCP, a truncated message, a killed sender, a timeout, a closed peer.
target_link_libraries(test_comm_mailbox PRIVATE Threads::Threads)
add_test(NAME comm_mailbox COMMAND test_comm_mailbox)
set_tests_properties(comm_mailbox PROPERTIES TIMEOUT 300 LABELS "comm;tsan")
add_test(NAME comm_init COMMAND test_comm_init)
set_tests_properties(comm_init PROPERTIES TIMEOUT 120 LABELS "comm")
add_test(NAME comm_fail COMMAND test_comm_fail)
set_tests_properties(comm_fail PROPERTIES TIMEOUT 300 LABELS "comm;tsan")
# A small sweep for `make tsan` (shared memory, TCP, progress thread).
add_test(NAME comm_sweep_small COMMAND test_comm_sweep shm_3 tcp_3)
set_tests_properties(comm_sweep_small PROPERTIES TIMEOUT 300 LABELS "comm;tsan")
# The single-copy (process_vm_readv / _writev) path forced on for every size, so the
# whole shm sweep at 2, 3 and 4 ranks runs through it where it applies.
add_test(NAME comm_sweep_cma COMMAND test_comm_sweep shm_2 shm_3 shm_4)
set_tests_properties(comm_sweep_cma PROPERTIES TIMEOUT 300 LABELS "comm;tsan"
                     ENVIRONMENT "DT_SHM_CMA=on;DT_SHM_CMA_MIN=1")
# The same with every single-copy allgather pushing (process_vm_writev into
# the peers' outputs) instead of only those of 4 MiB and more.
add_test(NAME comm_sweep_push COMMAND test_comm_sweep shm_2 shm_3 shm_4)
set_tests_properties(comm_sweep_push PROPERTIES TIMEOUT 300 LABELS "comm;tsan"
                     ENVIRONMENT "DT_SHM_CMA=on;DT_SHM_CMA_MIN=1;DT_SHM_PUSH_MIN=1")
# Randomized: every collective and send/recv against the serial reference
# (fuzz_*), and one rank's call changed in one field (mismatch_*), each
# case for DT_TEST_FUZZ_SECONDS (default 1.5 s); DT_TEST_SEED replays a run.
# Messages quoting a whole operation are cut on purpose.
target_compile_options(test_comm_fuzz PRIVATE -Wno-format-truncation)
add_test(NAME comm_fuzz_shm COMMAND test_comm_fuzz "fuzz_shm_*" "fuzz_cma_*")
add_test(NAME comm_fuzz_tcp COMMAND test_comm_fuzz "fuzz_tcp_*" "fuzz_hier_*")
add_test(NAME comm_mismatch COMMAND test_comm_fuzz "mismatch_*")
set_tests_properties(comm_fuzz_shm comm_fuzz_tcp comm_mismatch PROPERTIES TIMEOUT 600
                     LABELS "comm")
add_test(NAME comm_fuzz_small COMMAND test_comm_fuzz fuzz_shm_3 fuzz_tcp_3 mismatch_shm_3
                                      mismatch_tcp_3)
set_tests_properties(comm_fuzz_small PROPERTIES TIMEOUT 600 LABELS "comm;tsan")
# DT_DETERMINISTIC=1: allreduce and reduce-scatter bit-identical to the
# rank-ordered fold under every DT_ALGO, on shm, tcp and two simulated hosts,
# with tiny and default chunks; and a control showing the ring differs.
add_test(NAME comm_det COMMAND test_comm_det)
set_tests_properties(comm_det PROPERTIES TIMEOUT 300 LABELS "comm")
# torus2d, ring and hier across 4 hosts x 2 ranks made of network namespaces
# (scripts/netns-cluster.sh) with 1 Gbit/s links: exact results, the
# algorithm asked for, and a busbw table. Needs root, ip and tc: skipped
# otherwise.
add_test(NAME comm_torus_netns
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/torus_netns.sh $<TARGET_FILE:dtrain_cli> 1gbit 2 1)
set_tests_properties(comm_torus_netns PROPERTIES TIMEOUT 180 LABELS "comm;netns"
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK netns_eval)
# `dtrain bench topo` on network namespaces: shapes 2x2, 4x1, 1x4 and 4x2
# recognised, and the chooser picking the hierarchy from measured links when
# the links between hosts are shaped to 100 Mbit/s. Root, ip, tc, python3.
add_test(NAME comm_topo_netns
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/topo_netns.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(comm_topo_netns PROPERTIES TIMEOUT 240 LABELS "comm;netns"
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK netns_eval)
# `dtrain bench topo` on one host: every pair measured, the shape reported.
add_test(NAME comm_bench_topo COMMAND dtrain_cli bench topo --nproc 3 --bytes 64K)
set_tests_properties(comm_bench_topo PROPERTIES TIMEOUT 60 LABELS "comm"
                     PASS_REGULAR_EXPRESSION "hierarchy: 1 host\\(s\\) x 3 rank\\(s\\).*intra +3 ")

# Elastic memberships (dtrain/elastic.h): a rank, the store's host, two in a
# row killed; a newcomer let in; a job below its minimum. One entry per case.
foreach(case shrink host twice grow below)
  add_test(NAME comm_elastic_${case} COMMAND test_comm_elastic ${case})
  set_tests_properties(comm_elastic_${case} PROPERTIES TIMEOUT 90 LABELS "comm")
endforeach()
