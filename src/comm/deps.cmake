# comm's optional dependency: Open MPI (libopenmpi-dev). When found,
# src/comm/mpi_backend.c is compiled (DT_BACKEND=mpi, and the MPI bootstrap
# under mpirun/srun) and DT_HAVE_MPI is defined; otherwise the file is left
# out and DT_BACKEND=mpi is refused with a clear message.
option(DT_MPI "Build the MPI backend when MPI is found" ON)
if(DT_MPI)
  find_package(MPI COMPONENTS C QUIET)
endif()
if(DT_MPI AND MPI_C_FOUND)
  target_link_libraries(dtrain PUBLIC MPI::MPI_C)
  target_compile_definitions(dtrain PUBLIC DT_HAVE_MPI=1)
  message(STATUS "dtrain: MPI ${MPI_C_VERSION} found: DT_BACKEND=mpi available")
else()
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/comm/mpi_backend.c
                              PROPERTIES HEADER_FILE_ONLY ON)
  message(STATUS "dtrain: no MPI: DT_BACKEND=mpi unavailable")
endif()
