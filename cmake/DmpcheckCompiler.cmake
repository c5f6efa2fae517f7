# Compiler settings scoped to dmpcheck's own targets (no global flags).
# C++17, the project's language; libtorch 2.x's headers (torch >= 2.10) demand C++20, so a build
# against a torch wheel compiles the same code as C++20.
if(DMPCHECK_TORCH_PYTHON)
  set(CMAKE_CXX_STANDARD 20)
else()
  set(CMAKE_CXX_STANDARD 17)
endif()
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)

if(DMPCHECK_USE_CCACHE)
  find_program(DMPCHECK_CCACHE ccache)
  if(DMPCHECK_CCACHE)
    # pch_defines/time_macros: ccache must accept precompiled headers, see ccache(1) "Precompiled headers".
    set(CMAKE_CXX_COMPILER_LAUNCHER
        ${CMAKE_COMMAND} -E env
        "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        # Paths relative to the checkout: a fresh clone elsewhere hits the same cache entries.
        "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}"
        ${DMPCHECK_CCACHE})
    message(STATUS "dmpcheck: compiling through ${DMPCHECK_CCACHE}")
  endif()
endif()

# dmpcheck_target_defaults(<target>): warnings and the shared precompiled header.
function(dmpcheck_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
