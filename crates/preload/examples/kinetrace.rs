//! `libkinetrace.so` built again as an example: `cargo test -p kinetrace-preload` builds examples
//! but not a cdylib-only library, so the tests load this fresh copy. Same source as the library.

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

pub use nvtx::InitializeInjectionNvtx2;
pub use shim::{
    cuptiActivityRegisterCallbacks, kinetrace_is_active, kinetrace_step, InitializeInjection,
};
pub use torch_ops::{kinetrace_op_begin, kinetrace_op_end};
