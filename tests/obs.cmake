# Observability (docs/observability.md): the tracer's rings (unit/test_trace.c,
# also under TSan), traced runs checked as Chrome traces with aligned clocks,
# and the report's page in headless Chromium (label "browser"; skipped, 77,
# without chromium).
set_tests_properties(test_trace PROPERTIES LABELS "unit;tsan")
foreach(case ranks3 skew window)
  add_test(NAME obs_trace_${case}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/obs_trace.sh $<TARGET_FILE:dtrain_cli>
                   ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(obs_trace_${case} PROPERTIES TIMEOUT 180 LABELS "train;multiprocess")
endforeach()
foreach(case page straggler predicted)
  add_test(NAME obs_report_${case}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/obs_report.sh $<TARGET_FILE:dtrain_cli>
                   ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR} ${case})
  set_tests_properties(obs_report_${case} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77
                       LABELS "browser;multiprocess")
endforeach()
# The planner's predicted timeline (dtrain plan --timeline-json): the
# simulator and the step's agreement with the analytic model are in
# unit/test_plan_sim.c; here the command line and the report's overlay.
foreach(case timeline errors)
  add_test(NAME plan_sim_${case}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/plan_sim.sh $<TARGET_FILE:dtrain_cli>
                   ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(plan_sim_${case} PROPERTIES TIMEOUT 120 LABELS "parallel")
endforeach()
