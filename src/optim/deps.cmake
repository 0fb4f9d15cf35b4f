# optim: OpenMP splits large ranges across threads. The kernels are compiled
# without floating-point contraction so the AVX-512 path, the masked tail and
# the scalar fallback perform the same IEEE operations (bit-identical results
# for any split of a buffer into ranges, as ZeRO sharding needs).
find_package(OpenMP REQUIRED COMPONENTS C)
target_link_libraries(dtrain PUBLIC OpenMP::OpenMP_C)
file(GLOB DT_OPTIM_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/optim/*.c)
set_source_files_properties(${DT_OPTIM_SOURCES} PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
