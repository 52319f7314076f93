# Run by cmake --install (and cpack): copies the built package
# (PST_PYTHON_PACKAGE: the .py files and the _pstrain module) into the
# folder where the install prefix's Python finds it. python/CMakeLists.txt
# sets the PST_PYTHON_* variables this reads.
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(PST_PYTHON_SITE_DIR)
  set(site "${PST_PYTHON_SITE_DIR}")
elseif(EXISTS "$ENV{DESTDIR}${prefix}/pyvenv.cfg")
  # A virtual environment: its own site-packages (sysconfig's venv scheme).
  set(site "${prefix}/lib/python${PST_PYTHON_VERSION}/site-packages")
elseif(prefix MATCHES "/local/?$")
  # Debian's interpreter looks in /usr/local/lib/python3.X/dist-packages.
  set(site "${prefix}/lib/python${PST_PYTHON_VERSION}/dist-packages")
else()
  # Debian's layout for /usr (the .deb): one folder for every Python 3.
  set(site "${prefix}/lib/python3/dist-packages")
endif()
set(files "")
foreach(source IN LISTS PST_PYTHON_SOURCES PST_PYTHON_MODULE)
  list(APPEND files "${PST_PYTHON_PACKAGE}/${source}")
endforeach()
file(INSTALL DESTINATION "${site}/pstrain" TYPE FILE FILES ${files})
# The build tree's RPATH ($ORIGIN/../lib) means nothing where it is installed.
file(RPATH_REMOVE FILE "$ENV{DESTDIR}${site}/pstrain/${PST_PYTHON_MODULE}")
