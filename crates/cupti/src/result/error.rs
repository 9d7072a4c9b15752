//! CUPTI result codes, named by kinetrace itself: `cuptiGetResultString` answers 999 for every code
//! on CUPTI 13.3+ when no driver is present, so a message must not depend on it.
//!
//! See [`CUptiResult`](https://docs.nvidia.com/cupti/api/group__CUPTI__RESULT__API.html).

use std::fmt;

/// A CUPTI call failed with this raw `CUptiResult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CuptiError(pub u32);

/// `CUPTI_ERROR_MAX_LIMIT_REACHED`: the end of an activity buffer.
pub const MAX_LIMIT_REACHED: CuptiError = CuptiError(12);
/// `CUPTI_ERROR_NOT_INITIALIZED`: typically no usable driver.
pub const NOT_INITIALIZED: CuptiError = CuptiError(15);
/// `CUPTI_ERROR_INVALID_KIND`: an incomplete record; stop reading the buffer.
pub const INVALID_KIND: CuptiError = CuptiError(21);
/// `CUPTI_ERROR_NOT_SUPPORTED`: the library cannot do or answer this.
pub const NOT_SUPPORTED: CuptiError = CuptiError(27);
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`: another profiler holds the callback API.
pub const MULTIPLE_SUBSCRIBERS: CuptiError = CuptiError(39);
/// `CUPTI_ERROR_UNKNOWN`.
pub const UNKNOWN: CuptiError = CuptiError(999);

/// The `.result()` idiom: every wrapper in [`crate::result`] reads `unsafe { (lib.cuptiX)(..) }.result()`.
pub trait IntoResult {
    /// `Ok(())` for `CUPTI_SUCCESS`, else the error.
    fn result(self) -> Result<(), CuptiError>;
}

impl IntoResult for u32 {
    #[inline]
    fn result(self) -> Result<(), CuptiError> {
        if self == 0 {
            Ok(())
        } else {
            Err(CuptiError(self))
        }
    }
}

const NAMES: [&str; 48] = [
    "CUPTI_SUCCESS",
    "CUPTI_ERROR_INVALID_PARAMETER",
    "CUPTI_ERROR_INVALID_DEVICE",
    "CUPTI_ERROR_INVALID_CONTEXT",
    "CUPTI_ERROR_INVALID_EVENT_DOMAIN_ID",
    "CUPTI_ERROR_INVALID_EVENT_ID",
    "CUPTI_ERROR_INVALID_EVENT_NAME",
    "CUPTI_ERROR_INVALID_OPERATION",
    "CUPTI_ERROR_OUT_OF_MEMORY",
    "CUPTI_ERROR_HARDWARE",
    "CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT",
    "CUPTI_ERROR_API_NOT_IMPLEMENTED",
    "CUPTI_ERROR_MAX_LIMIT_REACHED",
    "CUPTI_ERROR_NOT_READY",
    "CUPTI_ERROR_NOT_COMPATIBLE",
    "CUPTI_ERROR_NOT_INITIALIZED",
    "CUPTI_ERROR_INVALID_METRIC_ID",
    "CUPTI_ERROR_INVALID_METRIC_NAME",
    "CUPTI_ERROR_QUEUE_EMPTY",
    "CUPTI_ERROR_INVALID_HANDLE",
    "CUPTI_ERROR_INVALID_STREAM",
    "CUPTI_ERROR_INVALID_KIND",
    "CUPTI_ERROR_INVALID_EVENT_VALUE",
    "CUPTI_ERROR_DISABLED",
    "CUPTI_ERROR_INVALID_MODULE",
    "CUPTI_ERROR_INVALID_METRIC_VALUE",
    "CUPTI_ERROR_HARDWARE_BUSY",
    "CUPTI_ERROR_NOT_SUPPORTED",
    "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED",
    "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_DEVICE",
    "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_NON_P2P_DEVICES",
    "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_WITH_MPS",
    "CUPTI_ERROR_CDP_TRACING_NOT_SUPPORTED",
    "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED",
    "CUPTI_ERROR_CUDA_COMPILER_NOT_COMPATIBLE",
    "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
    "CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED",
    "CUPTI_ERROR_OPENACC_UNDEFINED_ROUTINE",
    "CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED",
    "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
    "CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES",
    "CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED",
    "CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED",
    "CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED",
    "CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED",
    "CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED",
    "CUPTI_ERROR_INVALID_CHIP_NAME",
    "CUPTI_ERROR_HES_TRACE_NOT_SUPPORTED_ON_MPS",
];

impl CuptiError {
    /// The vendor's name for this code, or `None` for a code newer than this build.
    pub fn name(self) -> Option<&'static str> {
        match self.0 {
            999 => Some("CUPTI_ERROR_UNKNOWN"),
            n => NAMES.get(n as usize).copied(),
        }
    }

    /// A hint for the codes a user can act on.
    pub fn hint(self) -> Option<&'static str> {
        match self.0 {
            15 => Some("CUPTI could not initialise: no usable CUDA driver, or the driver is older than this CUPTI"),
            35 => Some("profiling needs privileges: set NVreg_RestrictProfilingToAdminUsers=0 or run as admin"),
            39 => Some("another profiler (Nsight Systems/Compute, torch.profiler, cuda-gdb) holds CUPTI"),
            999 => Some("CUPTI 13.3+ answers this for every call when the CUDA driver is missing"),
            _ => None,
        }
    }
}

impl fmt::Display for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0)?,
            None => write!(
                f,
                "CUPTI error {} (a code newer than this kinetrace)",
                self.0
            )?,
        }
        if let Some(h) = self.hint() {
            write!(f, ": {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CuptiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_header_numbers() {
        assert_eq!(CuptiError(0).name(), Some("CUPTI_SUCCESS"));
        assert_eq!(CuptiError(15).name(), Some("CUPTI_ERROR_NOT_INITIALIZED"));
        assert_eq!(CuptiError(21).name(), Some("CUPTI_ERROR_INVALID_KIND"));
        assert_eq!(
            CuptiError(39).name(),
            Some("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        );
        assert_eq!(
            CuptiError(47).name(),
            Some("CUPTI_ERROR_HES_TRACE_NOT_SUPPORTED_ON_MPS")
        );
        assert_eq!(CuptiError(999).name(), Some("CUPTI_ERROR_UNKNOWN"));
        assert_eq!(CuptiError(48).name(), None);
        assert!(CuptiError(48).to_string().contains("newer"));
        assert!(CuptiError(39).to_string().contains("another profiler"));
        assert_eq!(NOT_SUPPORTED.name(), Some("CUPTI_ERROR_NOT_SUPPORTED"));
        assert_eq!(0u32.result(), Ok(()));
        assert_eq!(15u32.result(), Err(NOT_INITIALIZED));
    }

    #[test]
    fn names_agree_with_the_generated_constants() {
        use kinetrace_cupti_sys::v13 as sys;
        assert_eq!(
            CuptiError(sys::CUPTI_ERROR_NOT_INITIALIZED).name(),
            Some("CUPTI_ERROR_NOT_INITIALIZED")
        );
        assert_eq!(
            CuptiError(sys::CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED).name(),
            Some("CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED")
        );
        assert_eq!(
            CuptiError(sys::CUPTI_ERROR_UNKNOWN).name(),
            Some("CUPTI_ERROR_UNKNOWN")
        );
    }
}
