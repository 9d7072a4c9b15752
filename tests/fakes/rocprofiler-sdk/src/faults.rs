//! The fault configuration, read once from the environment (see the crate docs).

use super::*;

/// The environment, read once.
pub(crate) struct Faults {
    pub(crate) version: (u32, u32, u32),
    pub(crate) fail: Vec<String>,
    pub(crate) drop_every: u64,
    pub(crate) already_initialized: bool,
    pub(crate) renumber: bool,
    pub(crate) other_tool: bool,
    pub(crate) complete_at_stop: bool,
}

pub(crate) fn faults() -> &'static Faults {
    static F: OnceLock<Faults> = OnceLock::new();
    F.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let version = var("FAKE_ROCP_VERSION")
            .and_then(|v| {
                let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
                Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
            })
            .unwrap_or((1, 1, 0));
        Faults {
            version,
            fail: var("FAKE_ROCP_FAIL")
                .map(|v| v.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            drop_every: var("FAKE_ROCP_DROP_EVERY")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            already_initialized: var("FAKE_ROCP_ALREADY_INITIALIZED").is_some(),
            renumber: var("FAKE_ROCP_RENUMBER").is_some(),
            other_tool: var("FAKE_ROCP_OTHER_TOOL").is_some(),
            complete_at_stop: var("FAKE_ROCP_COMPLETE_AT_STOP").is_some(),
        }
    })
}

pub(crate) fn fails(symbol: &str) -> bool {
    faults().fail.iter().any(|f| f == symbol || f == "*")
}

pub(crate) fn abi() -> Abi {
    let (major, minor, _) = faults().version;
    Abi::of_version(major, minor).unwrap_or(Abi::V1)
}
