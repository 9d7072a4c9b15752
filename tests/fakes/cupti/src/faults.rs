//! What the fake impersonates and which faults it injects, read once from the environment (the
//! variables are listed in the crate documentation).

use std::sync::OnceLock;
use std::time::Duration;

use kinetrace_cupti_sys::layouts::{release_of_api_version, Release};

/// The fake's configuration.
pub(crate) struct Config {
    /// What `cuptiGetVersion` answers.
    pub(crate) version: u32,
    /// The release that version is, as `kinetrace-cupti-sys`'s table reads it.
    pub(crate) release: Release,
    fail: Vec<String>,
    fail_code: u32,
    pub(crate) drop_every: u64,
    pub(crate) subscribe_refused: bool,
    pub(crate) late: Option<Duration>,
    pub(crate) hold: bool,
    pub(crate) slow_reader: Option<Duration>,
    pub(crate) wrong_struct_size: Option<u32>,
}

/// The release a `cuptiGetVersion` value stands for. Version 18 is 11.8 here: the fake writes the
/// 11.8 layouts for it (a test that wants 12.0 / 12.1 uses another version). Values no release
/// reports impersonate 12.9.
fn release_of(version: u32) -> Release {
    release_of_api_version(version, "libcupti.so.11.8").unwrap_or((12, 9))
}

pub(crate) fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok();
        let version = env("FAKE_CUPTI_VERSION")
            .and_then(|v| v.parse().ok())
            .unwrap_or(28);
        Config {
            version,
            release: release_of(version),
            fail: env("FAKE_CUPTI_FAIL")
                .map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
                .unwrap_or_default(),
            fail_code: env("FAKE_CUPTI_FAIL_CODE")
                .and_then(|v| v.parse().ok())
                .unwrap_or(15),
            drop_every: env("FAKE_CUPTI_DROP_EVERY")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            subscribe_refused: env("FAKE_CUPTI_SUBSCRIBE_REFUSED").is_some_and(|v| v == "1"),
            hold: env("FAKE_CUPTI_HOLD").is_some_and(|v| v == "1"),
            slow_reader: env("FAKE_CUPTI_SLOW_READER_NS")
                .and_then(|v| v.parse().ok())
                .map(Duration::from_nanos),
            late: env("FAKE_CUPTI_LATE_MS")
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
            wrong_struct_size: env("FAKE_CUPTI_WRONG_STRUCT_SIZE").and_then(|v| v.parse().ok()),
        }
    })
}

/// Whether the impersonated release is `major.minor` or newer.
pub(crate) fn at_least(major: u8, minor: u8) -> bool {
    config().release >= (major, minor)
}

/// Whether `name` is set to fail; returns the code to answer.
pub(crate) fn fails(name: &str) -> Option<u32> {
    let c = config();
    (c.fail
        .iter()
        .any(|f| f == name || (f == "*" && name != "cuptiGetVersion")))
    .then_some(c.fail_code)
}

/// `FAKE_CUPTI_SLOW_READER_NS`: keeps the calling (collector) thread busy for that long. A spin, not
/// a sleep: the reader stays busy, as a preempted collector would.
pub(crate) fn slow_reader() {
    if let Some(d) = config().slow_reader {
        let end = std::time::Instant::now() + d;
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
    }
}
