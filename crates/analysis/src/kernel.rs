//! Kernel classification by name, exactly as HolisticTraceAnalysis 0.5.0 does it.
//!
//! HTA (`hta/utils/utils.py`) classifies a GPU row only by its name, with `re.match` (anchored at
//! the start) and `.` not matching a newline:
//!
//! - COMMUNICATION: `^nccl.*Kernel`;
//! - MEMORY: `(^Memcpy)|(^Memset)|(^dma)`;
//! - COMPUTATION: anything that does not match `(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)`,
//!   i.e. that neither contains `Memcpy` or `Sync` on its first line nor starts with `Memset`;
//! - OTHER: the rest (for example `Event Sync`, or a name containing `Memcpy` later on).
//!
//! The checks run in that order, so a name is COMMUNICATION before it is MEMORY.

use serde::Serialize;

/// HTA's kernel type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum KernelType {
    /// Compute kernels (GEMMs, elementwise, ...).
    Computation,
    /// Collective-communication kernels (`nccl…Kernel…`).
    Communication,
    /// Copies and sets (`Memcpy…`, `Memset…`, `dma…`).
    Memory,
    /// Anything else (synchronization rows and the like).
    Other,
}

impl KernelType {
    /// The name HTA prints (`COMPUTATION`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            KernelType::Computation => "COMPUTATION",
            KernelType::Communication => "COMMUNICATION",
            KernelType::Memory => "MEMORY",
            KernelType::Other => "OTHER",
        }
    }
}

/// The text a `.*` prefix can cover: everything before the first newline.
fn first_line(s: &str) -> &str {
    s.split('\n').next().unwrap_or("")
}

/// `re.match(r"^nccl.*Kernel", name)`.
fn is_comm(name: &str) -> bool {
    name.strip_prefix("nccl")
        .is_some_and(|rest| first_line(rest).contains("Kernel"))
}

/// `re.match(r"(^Memcpy)|(^Memset)|(^dma)", name)`.
fn is_memory(name: &str) -> bool {
    name.starts_with("Memcpy") || name.starts_with("Memset") || name.starts_with("dma")
}

/// `not re.match(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)", name)`.
fn is_compute(name: &str) -> bool {
    let line = first_line(name);
    !(is_comm(name)
        || line.contains("Memcpy")
        || name.starts_with("Memset")
        || line.contains("Sync"))
}

/// HTA's `get_kernel_type(name)`.
pub fn kernel_type(name: &str) -> KernelType {
    if is_comm(name) {
        KernelType::Communication
    } else if is_memory(name) {
        KernelType::Memory
    } else if is_compute(name) {
        KernelType::Computation
    } else {
        KernelType::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_like_hta() {
        use KernelType::*;
        let cases = [
            (
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
                Communication,
            ),
            (
                "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                Communication,
            ),
            ("nccl_no_kernel_word", Computation),
            ("ncclX\nKernel", Computation),
            ("Memcpy DtoD (Device -> Device)", Memory),
            ("Memset (Device)", Memory),
            ("dma_copy", Memory),
            ("Event Sync", Other),
            ("Context Sync", Other),
            ("cudaStreamSynchronize", Other),
            ("void kernel_with_Memcpy_inside<float>()", Other),
            ("first line\nthen Memcpy", Computation),
            ("ampere_sgemm_128x64_nn", Computation),
            ("hipMemcpyWithStream", Other),
            ("", Computation),
        ];
        for (name, want) in cases {
            assert_eq!(kernel_type(name), want, "{name:?}");
        }
    }
}
