//! kinetrace's integration tests: one binary, one module per topic.

mod pipeline;
mod util;
