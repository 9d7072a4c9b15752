//! kinetrace's integration tests: one binary, one module per topic.

#![allow(missing_docs)]

mod defaults;
mod docs;
mod dynolog;
mod format;
mod layer;
mod local_users;
mod pipeline;
mod util;
mod workspace;
