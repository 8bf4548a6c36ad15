// CONCORD_CPU_CLONES: compile an executor twice, for baseline x86-64 and for
// AVX2, and let the loader pick one for the CPU at hand. Worth it where the
// per-element work is compute bound (float16 / bfloat16 conversions) and
// cheap elsewhere. Every kernel the executor calls must be inlined into it,
// so each clone holds a full set: the dtype visitors (kernels/dispatch.hpp)
// are, and a lambda the executor hands them is marked CONCORD_CLONED_BODY.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CONCORD_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef CONCORD_CPU_CLONES
#define CONCORD_CPU_CLONES
#endif

#define CONCORD_CLONED_BODY __attribute__((always_inline))
