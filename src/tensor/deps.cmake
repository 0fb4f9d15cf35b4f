# tensor: sgemm comes from OpenBLAS (cblas interface), our own kernels use
# OpenMP. Debian installs OpenBLAS's cblas.h under an openblas-<variant>
# directory; look there first so we never pick up the reference (netlib) one.
# This is libdtrain's one OpenBLAS lookup: amp and compress use it too.
find_package(OpenMP REQUIRED COMPONENTS C)
find_library(OPENBLAS_LIBRARY NAMES openblas
             PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial openblas REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu/openblas-openmp
                        aarch64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-openmp
                        openblas-pthread openblas-openmp openblas
          REQUIRED)
message(STATUS "tensor: OpenBLAS ${OPENBLAS_LIBRARY}, cblas.h in ${OPENBLAS_INCLUDE_DIR}")
target_include_directories(dtrain PRIVATE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(dtrain PUBLIC ${OPENBLAS_LIBRARY} OpenMP::OpenMP_C)
# oneDNN (Debian libdnnl-dev): dnnl_sgemm for the fp32 products (gemm.c) and,
# in amp, the bf16 matmul primitive. This is libdtrain's one oneDNN lookup;
# both layers build into the one dtrain target and test DT_HAVE_DNNL. Without
# libdnnl-dev the build still works: onednn.c then reports oneDNN unavailable.
find_path(DT_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(DT_DNNL_LIBRARY dnnl)
if(DT_DNNL_INCLUDE_DIR AND DT_DNNL_LIBRARY)
  target_include_directories(dtrain PRIVATE ${DT_DNNL_INCLUDE_DIR})
  target_compile_definitions(dtrain PRIVATE DT_HAVE_DNNL=1)
  target_link_libraries(dtrain PUBLIC ${DT_DNNL_LIBRARY})
else()
  message(WARNING "oneDNN (libdnnl-dev) not found: fp32 sgemm uses OpenBLAS only and the "
                  "onednn bf16 GEMM backend is disabled")
endif()
