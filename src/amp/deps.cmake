# amp: oneDNN (Debian libdnnl-dev) for the bf16 matmul, OpenBLAS for the fp32
# peer in `dtrain bench gemm-bf16` (and cblas_sbgemm when it is exported),
# OpenMP for our own bf16 kernel's threads, libdl for the sbgemm lookup.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
find_library(OPENBLAS_LIBRARY openblas REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
target_include_directories(dtrain PRIVATE ${DNNL_INCLUDE_DIR})
target_link_libraries(dtrain PUBLIC ${DNNL_LIBRARY} ${OPENBLAS_LIBRARY} OpenMP::OpenMP_C
                      ${CMAKE_DL_LIBS})
