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
