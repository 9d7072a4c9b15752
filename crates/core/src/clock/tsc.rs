//! The x86-64 time-stamp counter: the cheapest clock a recording thread can read, where the CPU and
//! the kernel both say it is invariant (constant rate in every power state, synchronised across
//! cores). Elsewhere the recording clock falls back to `CLOCK_MONOTONIC` (see the parent module).

/// Reads the counter. A plain `rdtsc`: no fence, so it may be ordered against nearby instructions by a
/// few cycles, which is far below what a span measures.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn read() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU, takes no operands and touches no memory; the
    // intrinsic is `unsafe` only because all `core::arch` intrinsics are.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(super) fn read() -> u64 {
    0
}

/// Whether the counter can stand in for `CLOCK_MONOTONIC`: the CPU reports an invariant TSC (CPUID
/// leaf 0x8000_0007, EDX bit 8) and, on Linux, the kernel still lists `tsc` among its usable clock
/// sources (it removes it when it finds the counters unsynchronised between sockets or unstable).
#[cfg(target_arch = "x86_64")]
// `__cpuid` became a safe function after this crate's minimum Rust version.
#[allow(unused_unsafe)]
pub(super) fn usable() -> bool {
    use core::arch::x86_64::__cpuid;
    // SAFETY: `cpuid` exists on every x86-64 CPU and only reads the requested leaf; leaf 0x8000_0000
    // reports the highest extended leaf, checked before 0x8000_0007 is asked for.
    let max_extended = unsafe { __cpuid(0x8000_0000) }.eax;
    if max_extended < 0x8000_0007 {
        return false;
    }
    // SAFETY: as above; the leaf exists (checked).
    let invariant = unsafe { __cpuid(0x8000_0007) }.edx & (1 << 8) != 0;
    invariant && kernel_trusts_tsc()
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn usable() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn kernel_trusts_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/available_clocksource")
        .is_ok_and(|s| s.split_whitespace().any(|c| c == "tsc"))
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn kernel_trusts_tsc() -> bool {
    false
}
