//! `libkinetrace.so` built again as an example: `cargo test -p kinetrace-preload` builds examples
//! but not a cdylib-only library, so the tests load this fresh copy. Same source as the library.

#[path = "../src/api.rs"]
mod api;
#[path = "../src/exit_signals.rs"]
mod exit_signals;
#[path = "../src/nvtx.rs"]
mod nvtx;
#[path = "../src/report.rs"]
mod report;
#[path = "../src/shim.rs"]
mod shim;
#[path = "../src/torch_ops.rs"]
mod torch_ops;

pub use api::{
    kinetrace_api_version, kinetrace_config_key_known, kinetrace_profile_outputs,
    kinetrace_profile_request, kinetrace_profile_start, kinetrace_profile_step,
    kinetrace_profile_stop,
};
pub use nvtx::InitializeInjectionNvtx2;
pub use shim::{
    cuptiActivityRegisterCallbacks, kinetrace_is_active, kinetrace_step, InitializeInjection,
};
pub use torch_ops::{kinetrace_op_begin, kinetrace_op_end};
