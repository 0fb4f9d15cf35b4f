/*
 * cpu.c — runtime CPU-feature detection and the active instruction-set level.
 *
 * A feature is usable only if the CPU has it (cpuid) AND the OS saves its
 * register state on context switches (XCR0, read with xgetbv): a kernel can
 * boot with AVX-512 disabled, and Linux (>= 5.16) additionally makes every
 * process ask for the 8 KiB AMX tile-data state with
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before its first tile
 * instruction, or that instruction faults. Detection runs once (pthread_once);
 * the permission request is made then, for the whole process.
 *
 * Invariants: active level <= max_level at all times; the level is a plain
 * atomic int so a kernel reads it with one load.
 */
#include "dtrain/tensor.h"
#include "tensor_internal.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILECFG   17
#define XFEATURE_XTILEDATA  18
#define XCR0_YMM            ((1u << 1) | (1u << 2))             /* SSE + AVX state */
#define XCR0_ZMM            ((1u << 5) | (1u << 6) | (1u << 7)) /* opmask, ZMM_Hi256, Hi16_ZMM */
#define XCR0_TILE           ((1ull << XFEATURE_XTILECFG) | (1ull << XFEATURE_XTILEDATA))

static const char *const isa_names[DT_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512bf16",
                                                    "amx"};
_Static_assert(sizeof isa_names / sizeof isa_names[0] == DT_ISA_COUNT, "one name per level");

static dt_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;
static atomic_int active_level = -1; /* -1: DT_ISA not read yet */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_status init_status = DT_OK;
static char init_message[256];
static bool init_done;

/* xgetbv without requiring -mxsave at compile time. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void) {
    dt_cpu_features *f = &features;
    memset(f, 0, sizeof *f);
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    bool osxsave = c & bit_OSXSAVE;
    bool avx = c & bit_AVX, fma = c & bit_FMA, f16c = c & bit_F16C;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool ymm_os = (xcr0 & XCR0_YMM) == XCR0_YMM;
    bool zmm_os = ymm_os && (xcr0 & XCR0_ZMM) == XCR0_ZMM;

    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        unsigned tmp_b, tmp_c, tmp_d;
        __cpuid_count(7, 1, a71, tmp_b, tmp_c, tmp_d);
    }
    f->avx2 = ymm_os && avx && (b7 & bit_AVX2);
    f->fma = ymm_os && fma;
    f->f16c = ymm_os && f16c;
    f->avx512f = zmm_os && (b7 & bit_AVX512F);
    f->avx512bw = zmm_os && (b7 & bit_AVX512BW);
    f->avx512vl = zmm_os && (b7 & bit_AVX512VL);
    f->avx512dq = zmm_os && (b7 & bit_AVX512DQ);
    f->avx512_bf16 = f->avx512f && (a71 & (1u << 5)); /* CPUID.(7,1):EAX[5] */
    f->avx512_fp16 = f->avx512f && (d7 & (1u << 23)); /* CPUID.(7,0):EDX[23] */
    f->amx_bf16 = d7 & (1u << 22);                    /* CPUID.(7,0):EDX[22] */
    f->amx_tile = d7 & (1u << 24);                    /* CPUID.(7,0):EDX[24] */

    if (!(f->amx_tile && f->amx_bf16)) {
        snprintf(f->amx_note, sizeof f->amx_note, "CPU has no AMX-BF16");
    } else if ((xcr0 & XCR0_TILE) != XCR0_TILE) {
        snprintf(f->amx_note, sizeof f->amx_note, "OS has not enabled AMX tile state (XCR0)");
    } else if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(f->amx_note, sizeof f->amx_note,
                 "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused");
    } else {
        f->amx_os = true;
    }

    dt_isa_level lvl = DT_ISA_SCALAR;
    if (f->avx2 && f->fma && f->f16c) {
        lvl = DT_ISA_AVX2;
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) {
            lvl = DT_ISA_AVX512;
            if (f->avx512_bf16) {
                lvl = DT_ISA_AVX512BF16;
                if (f->amx_os)
                    lvl = DT_ISA_AMX;
            }
        }
    }
    f->max_level = lvl;
}

const dt_cpu_features *dt_cpu_features_get(void) {
    pthread_once(&features_once, detect);
    return &features;
}

const char *dt_isa_name(dt_isa_level level) {
    return (unsigned)level < DT_ISA_COUNT ? isa_names[level] : "?";
}

dt_status dt_isa_parse(const char *knob, const char *text, dt_isa_level *out) {
    int idx;
    DT_CHECK(dt_config_parse_enum(knob, text, isa_names, DT_ISA_COUNT, &idx));
    *out = (dt_isa_level)idx;
    return DT_OK;
}

static dt_status unsupported(const char *knob, dt_isa_level want) {
    const dt_cpu_features *f = dt_cpu_features_get();
    char why[128] = "";
    if (want == DT_ISA_AMX && f->amx_note[0])
        snprintf(why, sizeof why, " (AMX: %s)", f->amx_note);
    return dt_error_set(DT_ERR_UNSUPPORTED, "%s=%s: this CPU supports only up to %s%s", knob,
                        dt_isa_name(want), dt_isa_name(f->max_level), why);
}

dt_status dt_isa_init(void) {
    pthread_mutex_lock(&init_lock);
    if (!init_done) {
        const dt_cpu_features *f = dt_cpu_features_get();
        dt_isa_level lvl = f->max_level;
        const char *env = getenv("DT_ISA");
        init_status = DT_OK;
        if (env && *env) {
            dt_isa_level want;
            init_status = dt_isa_parse("DT_ISA", env, &want);
            if (init_status == DT_OK && want > f->max_level)
                init_status = unsupported("DT_ISA", want);
            if (init_status == DT_OK)
                lvl = want;
            else
                snprintf(init_message, sizeof init_message, "%s", dt_last_error());
        }
        atomic_store(&active_level, (int)lvl);
        init_done = true;
    }
    dt_status st = init_status;
    pthread_mutex_unlock(&init_lock);
    if (st != DT_OK)
        dt_error_set(st, "%s", init_message);
    return st;
}

dt_isa_level dt_isa(void) {
    int lvl = atomic_load_explicit(&active_level, memory_order_relaxed);
    if (lvl >= 0)
        return (dt_isa_level)lvl;
    if (dt_isa_init() != DT_OK)
        DT_ERROR("%s; using %s", dt_last_error(), dt_isa_name(features.max_level));
    return (dt_isa_level)atomic_load(&active_level);
}

dt_status dt_isa_set(dt_isa_level level) {
    if ((unsigned)level >= DT_ISA_COUNT)
        return dt_error_set(DT_ERR_INVALID, "dt_isa_set: level %d out of range", (int)level);
    (void)dt_isa(); /* read DT_ISA first so it cannot later override this */
    if (level > dt_cpu_features_get()->max_level)
        return unsupported("dt_isa_set", level);
    atomic_store(&active_level, (int)level);
    return DT_OK;
}

size_t dt_tensor_plan_workspace(int threads, int T, int head_size) {
    size_t t = threads > 0 ? (size_t)threads : 1;
    return t * (dt__gemm_tn_workspace_bytes() + dt__attention_workspace_bytes(T, head_size));
}
