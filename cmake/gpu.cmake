# gpu.cmake — the GPU backend: the static library nstf_gpu built from
# src/ops/gpu/*.cu (CUDA with nvcc, or the same sources as HIP with hipcc),
# linked into nstf; with CUDA also the op-comparison test test_ops_gpu, the
# end-to-end test test_e2e_gpu and the kernel / inference benchmarks.
# Included by the top CMakeLists.txt when NSTF_CUDA or NSTF_HIP is ON.
#
# GPU_TARGETS: CUDA "sm_90a;sm_80" (default) or bare "90a;80";
#              HIP "gfx90a" (default) or any list of gfx targets.

if(NSTF_CUDA AND NSTF_HIP)
  message(FATAL_ERROR "NSTF: choose one of NSTF_CUDA and NSTF_HIP")
endif()

file(GLOB NSTF_GPU_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/ops/gpu/*.cu)

# The top-level add_compile_options() are GCC flags for C; the CUDA targets
# below replace them with their own (nvcc would reject -Wstrict-prototypes).
set(NSTF_GPU_HOST_WARN -Wall -Wextra -Wshadow -Wno-unused-parameter)

if(NSTF_CUDA)
  if(GPU_TARGETS)
    string(REPLACE "sm_" "" NSTF_CUDA_ARCHS "${GPU_TARGETS}")
  else()
    set(NSTF_CUDA_ARCHS "90a;80")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${NSTF_CUDA_ARCHS}")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # nstf was created before CUDA was enabled: give it the architectures too.
  set_target_properties(nstf PROPERTIES CUDA_ARCHITECTURES "${NSTF_CUDA_ARCHS}")
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)

  # Compile options for every CUDA target of ours (host side warnings via
  # -Xcompiler; nvcc's own warnings as errors when NSTF_WERROR).
  set(NSTF_CUDA_OPTIONS
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  if(NSTF_WERROR)
    list(APPEND NSTF_CUDA_OPTIONS $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
  if(CMAKE_BUILD_TYPE STREQUAL "Debug")
    list(APPEND NSTF_CUDA_OPTIONS $<$<COMPILE_LANGUAGE:CUDA>:-DNSTF_GPU_DEBUG>)
  endif()

  add_library(nstf_gpu STATIC ${NSTF_GPU_SOURCES})
  set_property(TARGET nstf_gpu PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
  # NCCL: only its header at build time (the toolkit ships it); the
  # library is loaded at run time (ccl.cu), so CI compiles these paths.
  if(NOT NSTF_NCCL STREQUAL "OFF")
    find_path(NSTF_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NSTF_NCCL_INCLUDE)
      target_include_directories(nstf_gpu PRIVATE ${NSTF_NCCL_INCLUDE})
      target_compile_definitions(nstf_gpu PRIVATE NSTF_HAVE_NCCL=1)
    elseif(NSTF_NCCL STREQUAL "ON")
      message(FATAL_ERROR "NSTF: NSTF_NCCL=ON but nccl.h was not found")
    endif()
  endif()
  set_target_properties(nstf_gpu PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                            POSITION_INDEPENDENT_CODE ON)
  target_include_directories(nstf_gpu PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(nstf PUBLIC NSTF_HAVE_CUDA=1)
  if(NSTF_SHARED)
    # libnstf.so holds every kernel once (the whole archive: tests call
    # launchers the library itself does not) and the shared CUDA runtime,
    # which the programs that link it share; they link nothing else of ours.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    set_target_properties(nstf_gpu PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
    target_link_libraries(nstf_gpu PUBLIC CUDA::cudart)
    target_link_libraries(nstf PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,nstf_gpu>")
    target_link_libraries(nstf PUBLIC CUDA::cudart)
    set(NSTF_GPU_LINK "")
  else()
    target_link_libraries(nstf_gpu PUBLIC CUDA::cudart_static)
    target_link_libraries(nstf PUBLIC nstf_gpu)
    # nstf_gpu calls back into nstf (nstf_set_error): let the linker see both
    # orders of the two static libraries.
    target_link_libraries(nstf_gpu PUBLIC nstf)
    set(NSTF_GPU_LINK nstf_gpu)
  endif()

  # The op-comparison harness and the GEMV benchmark (cuBLAS only here).
  if(EXISTS ${PROJECT_SOURCE_DIR}/tests/test_ops_gpu.cu)
    add_executable(test_ops_gpu ${PROJECT_SOURCE_DIR}/tests/test_ops_gpu.cu)
    set_property(TARGET test_ops_gpu PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
    target_link_libraries(test_ops_gpu PRIVATE nstf_internal ${NSTF_GPU_LINK})
    set_target_properties(test_ops_gpu PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
    add_test(NAME test_ops_gpu COMMAND test_ops_gpu WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(test_ops_gpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endif()

  # GEMM / attention (contiguous and paged) / conv2d-ladder tests and the GEMM /
  # attention benchmarks (cuBLAS in the GEMM bench only).
  foreach(t test_gemm_gpu test_attention_gpu test_paged_attn_gpu test_conv_gpu)
    add_executable(${t} ${PROJECT_SOURCE_DIR}/tests/${t}.cu)
    set_property(TARGET ${t} PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
    target_link_libraries(${t} PRIVATE nstf_internal ${NSTF_GPU_LINK})
    set_target_properties(${t} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
    add_test(NAME ${t} COMMAND ${t})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
  foreach(b gemm attention)
    add_executable(bench_${b} ${PROJECT_SOURCE_DIR}/bench/kernels/${b}/bench_${b}.cu)
    set_property(TARGET bench_${b} PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
    target_link_libraries(bench_${b} PRIVATE nstf_internal ${NSTF_GPU_LINK})
    set_target_properties(bench_${b} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
  endforeach()
  target_link_libraries(bench_gemm PRIVATE CUDA::cublas)

  # End to end (GPU forward vs CPU forward), the execution levels (unfused
  # kernels vs fp64, every level vs L3) and run-to-run determinism: C tests
  # that use the nstf CLI for gen-model.
  foreach(t test_e2e_gpu test_levels_gpu test_determinism_gpu test_train_gpu test_lowrank_gpu test_comm_gpu)
    add_executable(${t} ${PROJECT_SOURCE_DIR}/tests/${t}.c)
    target_link_libraries(${t} PRIVATE nstf_internal)
    target_compile_definitions(${t} PRIVATE NSTF_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                            NSTF_BUILD_DIR="${PROJECT_BINARY_DIR}")
    set_target_properties(${t} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
    add_dependencies(${t} nstf_cli)
    add_test(NAME ${t} COMMAND ${t} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
  # CPU tests built again with a GPU part: every row of the op table on
  # the GPU backend, at every level, through the backend table
  # (test_backend_ops); the library's threads and the GPU runtime's block
  # SIGINT (test_threads).
  foreach(pair test_backend_ops:TEST_BACKEND_GPU test_threads:TEST_THREADS_GPU)
    string(REPLACE ":" ";" pair ${pair})
    list(GET pair 0 src)
    list(GET pair 1 def)
    add_executable(${src}_gpu ${PROJECT_SOURCE_DIR}/tests/${src}.c)
    target_link_libraries(${src}_gpu PRIVATE nstf_internal)
    target_compile_definitions(${src}_gpu PRIVATE ${def}=1)
    set_target_properties(${src}_gpu PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
    add_test(NAME ${src}_gpu COMMAND ${src}_gpu)
    set_tests_properties(${src}_gpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
  add_executable(bench_infer ${PROJECT_SOURCE_DIR}/bench/gpu/bench_infer.c)
  target_link_libraries(bench_infer PRIVATE nstf_internal)
  set_target_properties(bench_infer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)

  if(EXISTS ${PROJECT_SOURCE_DIR}/bench/kernels/gemv/bench_gemv.cu)
    add_executable(bench_gemv ${PROJECT_SOURCE_DIR}/bench/kernels/gemv/bench_gemv.cu)
    set_property(TARGET bench_gemv PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
    target_link_libraries(bench_gemv PRIVATE nstf_internal ${NSTF_GPU_LINK} CUDA::cublas)
    set_target_properties(bench_gemv PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
    # numbered studies of the decode GEMV (bench/kernels/gemv/gemv_*_v<N>.cu)
    # and of the prefill's dequantization (bench/kernels/get_rows/*_v<N>.cu)
    file(GLOB NSTF_KERNEL_STUDIES ${PROJECT_SOURCE_DIR}/bench/kernels/gemv/gemv_*_v[0-9]*.cu
         ${PROJECT_SOURCE_DIR}/bench/kernels/get_rows/*_v[0-9]*.cu)
    foreach(src ${NSTF_KERNEL_STUDIES})
      get_filename_component(name ${src} NAME_WE)
      add_executable(${name} ${src})
      set_property(TARGET ${name} PROPERTY COMPILE_OPTIONS ${NSTF_CUDA_OPTIONS})
      target_link_libraries(${name} PRIVATE nstf_internal ${NSTF_GPU_LINK})
      set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
    endforeach()
  endif()
endif()

if(NSTF_HIP)
  # The same .cu files compiled as HIP by hipcc, one custom command each,
  # archived into nstf_gpu (hipcc is a wrapper CMake's HIP language rejects).
  find_program(NSTF_HIPCC hipcc REQUIRED)
  if(GPU_TARGETS)
    set(NSTF_HIP_ARCHS "${GPU_TARGETS}")
  else()
    set(NSTF_HIP_ARCHS "gfx90a")
  endif()
  set(NSTF_HIP_FLAGS -x hip -std=c++17 -O3 -fPIC -Wall -Wextra -Wno-unused-parameter
      -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src)
  if(NSTF_WERROR)
    list(APPEND NSTF_HIP_FLAGS -Werror)
  endif()
  if(CMAKE_BUILD_TYPE STREQUAL "Debug")
    list(APPEND NSTF_HIP_FLAGS -DNSTF_GPU_DEBUG)
  else()
    list(APPEND NSTF_HIP_FLAGS -DNDEBUG)
  endif()
  if(NOT NSTF_NCCL STREQUAL "OFF")
    find_path(NSTF_RCCL_INCLUDE rccl/rccl.h PATHS /opt/rocm/include)
    if(NSTF_RCCL_INCLUDE)
      list(APPEND NSTF_HIP_FLAGS -DNSTF_HAVE_NCCL=1 -I${NSTF_RCCL_INCLUDE})
    elseif(NSTF_NCCL STREQUAL "ON")
      message(FATAL_ERROR "NSTF: NSTF_NCCL=ON but rccl/rccl.h was not found")
    endif()
  endif()
  foreach(arch ${NSTF_HIP_ARCHS})
    list(APPEND NSTF_HIP_FLAGS --offload-arch=${arch})
  endforeach()
  # The compiled targets, for the runtime check of the device (gpu_common.cu):
  # "gfx90a,gfx942" (feature suffixes such as :xnack- dropped).
  string(REGEX REPLACE ":[^;]*" "" NSTF_HIP_TARGET_LIST "${NSTF_HIP_ARCHS}")
  string(REPLACE ";" "," NSTF_HIP_TARGET_LIST "${NSTF_HIP_TARGET_LIST}")
  list(APPEND NSTF_HIP_FLAGS "-DNSTF_HIP_TARGETS=\"${NSTF_HIP_TARGET_LIST}\"")
  # roctx ranges (rocprof / Perfetto show our op names) when ROCm's roctracer
  # is installed; without it the range calls are no-ops.
  find_library(NSTF_ROCTX roctx64)
  find_path(NSTF_ROCTX_INCLUDE roctracer/roctx.h)
  if(NSTF_ROCTX AND NSTF_ROCTX_INCLUDE)
    list(APPEND NSTF_HIP_FLAGS -DNSTF_HAVE_ROCTX=1 -I${NSTF_ROCTX_INCLUDE})
  endif()
  file(GLOB NSTF_GPU_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/ops/gpu/*.h
       ${PROJECT_SOURCE_DIR}/src/ops/gpu/vendors/*.h)
  set(NSTF_HIP_OBJECTS)
  foreach(src ${NSTF_GPU_SOURCES})
    get_filename_component(stem ${src} NAME_WE)
    set(obj ${CMAKE_CURRENT_BINARY_DIR}/nstf_gpu_hip/${stem}.o)
    add_custom_command(OUTPUT ${obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/nstf_gpu_hip
      COMMAND ${NSTF_HIPCC} ${NSTF_HIP_FLAGS} -c ${src} -o ${obj}
      DEPENDS ${src} ${NSTF_GPU_HEADERS}
      COMMENT "hipcc ${stem}.cu"
      VERBATIM)
    list(APPEND NSTF_HIP_OBJECTS ${obj})
  endforeach()
  add_library(nstf_gpu STATIC ${NSTF_HIP_OBJECTS})
  set_target_properties(nstf_gpu PROPERTIES LINKER_LANGUAGE CXX)
  enable_language(CXX)
  find_library(NSTF_AMDHIP64 amdhip64 REQUIRED)
  target_link_libraries(nstf_gpu PUBLIC ${NSTF_AMDHIP64} nstf)
  if(NSTF_ROCTX AND NSTF_ROCTX_INCLUDE)
    target_link_libraries(nstf_gpu PUBLIC ${NSTF_ROCTX})
  endif()
  target_compile_definitions(nstf PUBLIC NSTF_HAVE_HIP=1)
  target_link_libraries(nstf PUBLIC nstf_gpu)
endif()

enable_testing()
