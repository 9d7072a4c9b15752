//! kinetrace's integration tests: one binary, one module per topic.

mod format;
mod layer;
mod pipeline;
mod util;
mod workspace;
