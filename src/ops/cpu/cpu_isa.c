/* cpu_isa.c — run-time choice of the CPU kernels' SIMD level (cpuid). */
#include "ops/cpu/cpu_isa.h"

#include "core/switches.h"

#include <stdlib.h>
#include <string.h>

static int g_isa = -1; /* current level; -1 until first use */

nstf_cpu_isa nstf_cpu_isa_best(void) {
#if NSTF_CPU_HAVE_AVX512
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return NSTF_ISA_AVX512;
#endif
#if NSTF_CPU_HAVE_AVX2
    return NSTF_ISA_AVX2;
#else
    return NSTF_ISA_SCALAR;
#endif
}

bool nstf_cpu_has_vnni(void) {
#if NSTF_CPU_HAVE_AVX512
    static int vnni = -1; /* asked per tile: cpuid once */
    int v = __atomic_load_n(&vnni, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = nstf_cpu_isa_best() == NSTF_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
        __atomic_store_n(&vnni, v, __ATOMIC_RELAXED);
    }
    return v != 0;
#else
    return false;
#endif
}

const char *nstf_cpu_isa_name(nstf_cpu_isa isa) {
    switch (isa) {
    case NSTF_ISA_SCALAR: return "scalar";
    case NSTF_ISA_AVX2: return "avx2";
    case NSTF_ISA_AVX512: return nstf_cpu_has_vnni() ? "avx512vnni" : "avx512";
    }
    return "?";
}

nstf_cpu_isa nstf_cpu_isa_current(void) {
    int isa = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
    if (isa >= 0) return (nstf_cpu_isa)isa;
    isa = (int)nstf_cpu_isa_best();
    const int want = nstf_switch_int(NSTF_SW_CPU_ISA); /* NSTF_CPU_ISA, through the registry */
    if (want != NSTF_SWITCH_AUTO && want <= isa) isa = want;
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
    return (nstf_cpu_isa)isa;
}

bool nstf_cpu_isa_force(nstf_cpu_isa isa) {
    if ((int)isa < 0 || isa > nstf_cpu_isa_best()) return false;
    __atomic_store_n(&g_isa, (int)isa, __ATOMIC_RELAXED);
    return true;
}
