# amp: oneDNN (Debian libdnnl-dev) for the bf16 matmul, OpenBLAS for the
# sgemm backends and the fp32 peer in `dtrain bench gemm-bf16` (and its
# cblas_sbgemm when exported), OpenMP for our kernels' threads, libdl for
# the sbgemm lookup. OpenBLAS (library and cblas.h) is tensor/deps.cmake's
# lookup: tensor comes before amp in DT_LAYERS and both build into the one
# dtrain target. oneDNN variables are prefixed DT_AMP_. Without libdnnl-dev
# the build still works: the oneDNN backend then reports itself unavailable
# and the next one is used.
find_path(DT_AMP_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(DT_AMP_DNNL_LIBRARY dnnl)
find_package(OpenMP REQUIRED COMPONENTS C)
if(DT_AMP_DNNL_INCLUDE_DIR AND DT_AMP_DNNL_LIBRARY)
  target_include_directories(dtrain PRIVATE ${DT_AMP_DNNL_INCLUDE_DIR})
  target_compile_definitions(dtrain PRIVATE DT_HAVE_DNNL=1)
  target_link_libraries(dtrain PUBLIC ${DT_AMP_DNNL_LIBRARY})
else()
  message(WARNING "oneDNN (libdnnl-dev) not found: the onednn bf16 GEMM backend is disabled")
endif()
target_link_libraries(dtrain PUBLIC OpenMP::OpenMP_C ${CMAKE_DL_LIBS})
