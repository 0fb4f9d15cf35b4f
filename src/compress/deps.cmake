# compress: PowerSGD's products use OpenBLAS's cblas_sgemm. The lookup is
# tensor/deps.cmake's (DT_LAYERS lists tensor before compress and every layer
# builds into the one dtrain target, so cblas.h and the library are already
# on it); a second find_library would only be another place to keep in step.

# Codec arithmetic is exactly as written (no FMA contraction, which GNU C
# allows by default): encodings and residuals are then the same bytes in
# native and portable builds and on CPUs with and without FMA, and the
# fused error-feedback path equals the generic one bit for bit (tested).
file(GLOB DT_COMPRESS_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/compress/*.c)
set_source_files_properties(${DT_COMPRESS_SOURCES} PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
