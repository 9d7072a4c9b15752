/*!
The CUPTI backend of kinetrace: an [`ActivitySource`](kinetrace_core::ActivitySource) that records
kernels, copies, sets, runtime/driver calls, synchronizations, memory and markers from whatever CUPTI
the node has (11.8, 12.x, 13.x), decided at run time.

The key design decision: **the library found at run time decides how bytes are read, not the headers
present at build time.** [`loader`] finds libcupti and confirms the driver before the first CUPTI call;
[`version`] maps `cuptiGetVersion` (+ SONAME) to the record layouts that release writes; [`decode`]
is a set of pure, length-checked functions from record bytes to
[`Activity`](kinetrace_core::Activity), reading fields at offsets taken from the bindgen structs of
`kinetrace-cupti-sys`. CUPTI's callbacks do nothing but hand buffers over through the lock-free
[`pool`]; decoding happens on the collector thread in [`CuptiSource::poll`](kinetrace_core::ActivitySource::poll).

```no_run
let source = kinetrace_cupti::CuptiSource::new(Default::default());
// kinetrace::Profiler::builder().source(source).start()
# drop(source);
```
*/
#![deny(missing_docs)]

pub mod decode;
pub mod kinds;
pub mod loader;
pub mod names;
pub mod pool;
pub mod result;
mod source;
pub mod version;

pub use loader::CuptiOpenError;
pub use result::CuptiError;
pub use source::{
    kinds_for, pool_stats, struct_size_mismatches, CuptiConfig, CuptiSource, EnableError,
    LibraryInfo,
};
pub use version::{Layout, Release};

/// The raw bindings, for tests and tools that need the vendor structs.
pub use kinetrace_cupti_sys as sys;
