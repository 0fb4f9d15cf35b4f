# amp: oneDNN (Debian libdnnl-dev) for the bf16 matmul, OpenBLAS for the
# sgemm backend and the fp32 peer in `dtrain bench gemm-bf16` (and its
# cblas_sbgemm when exported), OpenMP for our bf16 kernels' threads, libdl
# for the sbgemm lookup. Without libdnnl-dev the build still works: the
# oneDNN backend then reports itself unavailable and the next one is used.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(DNNL_LIBRARY dnnl)
find_library(OPENBLAS_LIBRARY openblas REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY)
  target_include_directories(dtrain PRIVATE ${DNNL_INCLUDE_DIR})
  target_compile_definitions(dtrain PRIVATE DT_HAVE_DNNL=1)
  target_link_libraries(dtrain PUBLIC ${DNNL_LIBRARY})
else()
  message(WARNING "oneDNN (libdnnl-dev) not found: the onednn bf16 GEMM backend is disabled")
endif()
target_link_libraries(dtrain PUBLIC ${OPENBLAS_LIBRARY} OpenMP::OpenMP_C ${CMAKE_DL_LIBS})
