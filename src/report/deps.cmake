# report: the page's script and style are compiled in (cmake/embed.cmake),
# so `dtrain report` writes a self-contained file wherever it runs.
set(DT_REPORT_ASSETS ${CMAKE_BINARY_DIR}/generated/report_assets.h)
add_custom_command(
  OUTPUT ${DT_REPORT_ASSETS}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/generated
  COMMAND ${CMAKE_COMMAND} -DOUT=${DT_REPORT_ASSETS}
          "-DINPUTS=dt__page_js=${PROJECT_SOURCE_DIR}/src/report/page.js\\;dt__page_css=${PROJECT_SOURCE_DIR}/src/report/page.css"
          -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
  DEPENDS ${PROJECT_SOURCE_DIR}/src/report/page.js ${PROJECT_SOURCE_DIR}/src/report/page.css
          ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
  COMMENT "Embedding the report's script and style")
target_sources(dtrain PRIVATE ${DT_REPORT_ASSETS})
target_include_directories(dtrain PRIVATE ${CMAKE_BINARY_DIR}/generated)
