# optim: the same test once more with the kernels compiled without AVX-512,
# so the scalar fallback (what a portable -DDT_NATIVE=OFF build runs) is
# checked against the PyTorch fixture on an AVX-512 machine too. The test
# compiles the optim sources itself; the linker then never pulls the
# AVX-512 objects out of libdtrain.
file(GLOB optim_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/optim/*.c)
add_executable(test_optim_scalar ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_optim.c ${optim_sources})
target_compile_options(test_optim_scalar PRIVATE -mno-avx512f -ffp-contract=off)
target_include_directories(test_optim_scalar PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                           ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_optim_scalar PRIVATE _GNU_SOURCE
                           DT_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
target_link_libraries(test_optim_scalar PRIVATE dtrain OpenMP::OpenMP_C)
add_test(NAME test_optim_scalar COMMAND test_optim_scalar)
set_tests_properties(test_optim_scalar PROPERTIES TIMEOUT 300 LABELS "unit")
