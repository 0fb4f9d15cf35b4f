# compress: PowerSGD's products use OpenBLAS's cblas_sgemm. The variables are
# prefixed DT_COMPRESS_ so they never collide with another layer's OpenBLAS
# lookup (the tensor layer has its own); linking the same library twice is
# harmless. Debian keeps OpenBLAS's cblas.h under openblas-<variant>.
find_library(DT_COMPRESS_OPENBLAS_LIBRARY NAMES openblas
             PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial openblas REQUIRED)
find_path(DT_COMPRESS_CBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu/openblas-openmp
                        aarch64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-openmp
                        openblas-pthread openblas-openmp openblas
          REQUIRED)
target_include_directories(dtrain PRIVATE ${DT_COMPRESS_CBLAS_INCLUDE_DIR})
target_link_libraries(dtrain PUBLIC ${DT_COMPRESS_OPENBLAS_LIBRARY})

# Codec arithmetic is exactly as written (no FMA contraction, which GNU C
# allows by default): encodings and residuals are then the same bytes in
# native and portable builds and on CPUs with and without FMA, and the
# fused error-feedback path equals the generic one bit for bit (tested).
file(GLOB DT_COMPRESS_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/compress/*.c)
set_source_files_properties(${DT_COMPRESS_SOURCES} PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
