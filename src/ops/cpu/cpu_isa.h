/* cpu_isa.h — which SIMD level the CPU kernels run at, chosen at run time.
 *
 * The build is -march=native, but the machines a build runs on change
 * between AVX2-only and AVX-512 processors, so the AVX-512 kernels are
 * compiled with function target attributes and chosen by cpuid; the AVX2
 * kernels need the build's own ISA (NSTF_CPU_HAVE_AVX2). The scalar
 * kernels are always there. Every level the CPU has can be forced, so the
 * tests run each one (NSTF_CPU_ISA=scalar|avx2|avx512 in the environment
 * does the same for a whole process). */
#ifndef NSTF_OPS_CPU_ISA_H
#define NSTF_OPS_CPU_ISA_H

#include <stdbool.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define NSTF_CPU_HAVE_AVX2 1
#else
#define NSTF_CPU_HAVE_AVX2 0
#endif
/* AVX-512 kernels: x86-64 GCC/clang with the AVX2 build (they reuse its
 * inline helpers). */
#if NSTF_CPU_HAVE_AVX2 && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define NSTF_CPU_HAVE_AVX512 1
#define NSTF_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define NSTF_TARGET_AVX512VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#else
#define NSTF_CPU_HAVE_AVX512 0
#endif

typedef enum nstf_cpu_isa {
    NSTF_ISA_SCALAR = 0,
    NSTF_ISA_AVX2 = 1,
    NSTF_ISA_AVX512 = 2, /* F + BW + VL (+ VNNI where the CPU has it) */
} nstf_cpu_isa;

/* The level kernels use now: the best the CPU and build allow, unless
 * forced (by nstf_cpu_isa_force or NSTF_CPU_ISA). */
nstf_cpu_isa nstf_cpu_isa_current(void);
/* The best level this CPU and build support. */
nstf_cpu_isa nstf_cpu_isa_best(void);
/* True when the AVX-512 level also has VNNI (vpdpwssd / vpdpbusd). */
bool nstf_cpu_has_vnni(void);
/* Force a level (tests, benchmarks). False, and nothing changes, if the
 * CPU or build lacks it. Not thread-safe against running kernels. */
bool nstf_cpu_isa_force(nstf_cpu_isa isa);
const char *nstf_cpu_isa_name(nstf_cpu_isa isa);

#endif
