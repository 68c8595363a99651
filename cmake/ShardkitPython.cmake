# Finds what the Python module (python/) needs and defines SHARDKIT_BUILD_PYTHON:
# ON by default when Python 3's development files and pybind11 are found.
#
# Interpreter: -DPython3_EXECUTABLE=... wins; else an active virtualenv; else
# /usr/bin/python3 (Debian's, with the test modules) rather than the first
# python3 on PATH. pybind11: Debian's pybind11-dev, or `python -m pybind11`'s.
if(DEFINED SHARDKIT_BUILD_PYTHON AND NOT SHARDKIT_BUILD_PYTHON)
  return()
endif()
if(NOT DEFINED Python3_EXECUTABLE AND NOT DEFINED ENV{VIRTUAL_ENV} AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
set(_sk_py_found OFF)
if(Python3_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir
    OUTPUT_VARIABLE _sk_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # The interpreter's own pybind11 first (a venv's pip pybind11), then the system's: a
  # pybind11 older than the interpreter (Debian's 2.10 predates Python 3.12 support,
  # which came in 2.11) is not supported by pybind11 for it.
  if(_sk_pybind11_dir)
    find_package(pybind11 CONFIG QUIET PATHS ${_sk_pybind11_dir} NO_DEFAULT_PATH)
  endif()
  if(NOT pybind11_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(pybind11_FOUND AND pybind11_VERSION VERSION_LESS 2.11 AND Python3_VERSION VERSION_GREATER_EQUAL 3.12)
    message(WARNING "shardkit: pybind11 ${pybind11_VERSION} predates Python ${Python3_VERSION} (supported from "
      "pybind11 2.11): the module may break other extensions imported after it; install a newer pybind11 "
      "for this interpreter (pip install pybind11)")
  endif()
  if(pybind11_FOUND)
    set(_sk_py_found ON)
  endif()
endif()
option(SHARDKIT_BUILD_PYTHON "Build the Python module (needs Python 3 headers and pybind11)" ${_sk_py_found})
if(SHARDKIT_BUILD_PYTHON AND NOT _sk_py_found)
  message(FATAL_ERROR "SHARDKIT_BUILD_PYTHON is ON but Python 3 development files or pybind11 were not found")
endif()
if(SHARDKIT_BUILD_PYTHON)
  message(STATUS "shardkit: Python module for ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pybind11_VERSION}")
endif()
