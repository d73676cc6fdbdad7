"""Timeline stamps for the sparse MLA decode kernels, built only into the variants a benchmark asks for
(`trace=True`, benchmarks/attention/trace_attention.py); the kernels serving builds have none.

A stamp is one thread's (%globaltimer ns, %clock64 cycles) at a point of its CTA's code, written to
trace[token, head block, split, stamp]. `dep` is a value the stamp waits for (a loaded length or slot), so a stamp
placed after a load marks when the load's data arrived, not when it was issued.
"""

TRACE_SRC = r"""
__device__ __forceinline__ void dsv4_stamp(void* p, int dep) {
  long long g, c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g) : "r"(dep) : "memory");
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory");
  reinterpret_cast<long long*>(p)[0] = g;
  reinterpret_cast<long long*>(p)[1] = c;
}
"""


def stamp_macro(T, enabled: bool):
    """stamp(trace, t, hb, split, k, who, dep): thread `who` stamps point k (nothing where tracing is off, or where
    k < 0: a point the kernel passes in a loop, stamped only at some of its iterations)."""

    @T.macro
    def stamp(trace, t, hb, split, k, who, dep):
        if enabled:
            if T.get_thread_binding() == who and k >= 0:
                T.call_extern("handle", "dsv4_stamp", T.address_of(trace[t, hb, split, k, 0]), T.Cast("int32", dep))

    return stamp


def stamp_after(T, k0, n: int):
    """Point k0 + n of a stamp series based at k0, or -1 (no stamp) where the series is off (k0 < 0)."""
    return T.if_then_else(k0 >= 0, k0 + n, -1)
