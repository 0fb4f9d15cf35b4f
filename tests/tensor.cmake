# The tensor kernels once more with AVX-512 disabled, so the scalar fallback
# paths are tested on an AVX-512 machine too. The test programs compile the
# tensor (and nn) sources themselves; the linker then never pulls the
# AVX-512 objects out of libdtrain.
file(GLOB tensor_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tensor/*.c)
file(GLOB nn_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/nn/*.c)
foreach(t test_tensor test_gpt_reference)
  add_executable(${t}_scalar ${CMAKE_CURRENT_SOURCE_DIR}/unit/${t}.c ${tensor_sources}
                 ${nn_sources})
  target_compile_options(${t}_scalar PRIVATE -mno-avx512f)
  target_include_directories(${t}_scalar PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                             ${PROJECT_SOURCE_DIR}/src ${OPENBLAS_INCLUDE_DIR})
  target_compile_definitions(${t}_scalar PRIVATE _GNU_SOURCE
                             DT_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
  target_link_libraries(${t}_scalar PRIVATE dtrain OpenMP::OpenMP_C)
  add_test(NAME ${t}_scalar COMMAND ${t}_scalar)
  set_tests_properties(${t}_scalar PROPERTIES TIMEOUT 300 LABELS "unit")
endforeach()
