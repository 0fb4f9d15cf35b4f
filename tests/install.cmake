# The installable library: `make install` into a temporary prefix, the
# examples built against it with pkg-config and run.
add_test(NAME install_examples
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/install_examples.sh ${CMAKE_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(install_examples PROPERTIES TIMEOUT 300 LABELS "unit;noasan")
