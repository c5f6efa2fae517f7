# Points find_package(Torch) at the libtorch inside a torch wheel (DMPCHECK_TORCH_PYTHON's torch),
# and keeps Debian's libtorch (in the default library path) out of the link.
execute_process(
  COMMAND "${DMPCHECK_TORCH_PYTHON}" -c
          "import os, torch, torch.utils; print(torch.utils.cmake_prefix_path); print(os.path.dirname(torch.__file__)); print(torch.__version__)"
  OUTPUT_VARIABLE _dmpcheck_torch_out
  ERROR_VARIABLE _dmpcheck_torch_err
  RESULT_VARIABLE _dmpcheck_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _dmpcheck_torch_rc EQUAL 0)
  if(DEFINED SKBUILD)
    # pip's default build isolation hides the environment's torch from the build (dmpcheck must
    # link the libtorch of the torch it will run beside, so it cannot declare its own torch).
    message(FATAL_ERROR "dmpcheck builds against the torch of the environment it is installed into, and pip's "
            "build isolation hides it (`import torch` failed in ${DMPCHECK_TORCH_PYTHON}). In an environment that "
            "has torch, type:\n    pip install --no-build-isolation .\n(after `pip install scikit-build-core` "
            "there).\n${_dmpcheck_torch_err}")
  endif()
  message(FATAL_ERROR "DMPCHECK_TORCH_PYTHON=${DMPCHECK_TORCH_PYTHON}: `import torch` failed:\n${_dmpcheck_torch_err}")
endif()
string(REPLACE "\n" ";" _dmpcheck_torch_out "${_dmpcheck_torch_out}")
list(GET _dmpcheck_torch_out 0 _dmpcheck_torch_prefix)
list(GET _dmpcheck_torch_out 1 _dmpcheck_torch_root)
list(GET _dmpcheck_torch_out 2 _dmpcheck_torch_version)
message(STATUS "dmpcheck: building against torch ${_dmpcheck_torch_version} at ${_dmpcheck_torch_root}")
list(PREPEND CMAKE_PREFIX_PATH "${_dmpcheck_torch_prefix}")
# TorchConfig.cmake looks its libraries up with find_library, which would search /usr/lib (Debian's
# libtorch) before the wheel: name the wheel's own.
foreach(_lib torch torch_cpu c10)
  string(TOUPPER "${_lib}" _upper)
  find_library(DMPCHECK_WHEEL_${_upper} ${_lib} PATHS "${_dmpcheck_torch_root}/lib" NO_DEFAULT_PATH REQUIRED)
endforeach()
set(TORCH_LIBRARY "${DMPCHECK_WHEEL_TORCH}" CACHE FILEPATH "libtorch of the wheel" FORCE)
set(c10_LIBRARY "${DMPCHECK_WHEEL_C10}" CACHE FILEPATH "libc10 of the wheel" FORCE)
set(Python_EXECUTABLE "${DMPCHECK_TORCH_PYTHON}" CACHE FILEPATH "The Python the module is built for" FORCE)
# The wheel's CUDA runtime and NCCL (nvidia-* wheels next to torch), so that the NCCL communicator
# loads the same libraries as torch itself.
get_filename_component(_dmpcheck_site "${_dmpcheck_torch_root}" DIRECTORY)
set(DMPCHECK_WHEEL_CUDA_HINTS "")
foreach(_dir nvidia/nccl nvidia/cu13 nvidia/cuda_runtime)
  if(EXISTS "${_dmpcheck_site}/${_dir}")
    list(APPEND DMPCHECK_WHEEL_CUDA_HINTS "${_dmpcheck_site}/${_dir}")
  endif()
endforeach()
# Torch's CUDA setup would otherwise probe the GPUs with a test program (try_run), which CMake 3.25
# cannot build as C++20 CUDA; dmpcheck compiles no CUDA code, so any list will do.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures (unused: dmpcheck compiles no CUDA code)")
endif()
