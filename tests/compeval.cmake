# bench/compression-eval.sh in a tiny mode on two network namespaces: the
# table is produced and sane, and a run (also an interrupted one) leaves no
# namespace or process behind. Needs root and iproute2: skipped otherwise.
add_test(NAME compress_eval_netns
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/compress/eval_netns.sh
                 $<TARGET_FILE:dtrain_cli> none topk:0.01@2~4/v+d300)
set_tests_properties(compress_eval_netns PROPERTIES TIMEOUT 150 LABELS "netns"
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK netns_eval)
