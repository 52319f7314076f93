# Read by cpack before it packs (CPACK_PROJECT_CONFIG_FILE): a build that
# links the CUDA runtime from outside Debian would make a package whose
# Depends cannot bring it, so it is refused with the way out.
if(CPACK_PSTRAIN_CUDA)
  message(FATAL_ERROR
    "this build links the CUDA runtime (from ${CPACK_PSTRAIN_CUDA_LIBRARIES}), which no Debian "
    "package provides, so a .deb of it would not run where it is installed; make the package "
    "from a CPU build of its own (the programs and the module, no test): scripts/package_deb.sh")
endif()
