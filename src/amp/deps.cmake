# amp: OpenBLAS for the sgemm backends and the fp32 peer in `dtrain bench
# gemm-bf16` (and its cblas_sbgemm when exported), oneDNN for the bf16
# matmul, OpenMP for our kernels' threads, libdl for the sbgemm lookup.
# OpenBLAS and oneDNN (DT_HAVE_DNNL) are found by tensor/deps.cmake: tensor
# comes before amp in DT_LAYERS and both build into the one dtrain target.
find_package(OpenMP REQUIRED COMPONENTS C)
target_link_libraries(dtrain PUBLIC OpenMP::OpenMP_C ${CMAKE_DL_LIBS})
