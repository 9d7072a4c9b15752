//! Process-wide name interning.
//!
//! Records carry a [`NameId`] (4 bytes, `Copy`) instead of a `String`, so recording allocates nothing.
//! A name is interned once (per callsite, per kernel symbol) and resolved once per trace by the exporter
//! through a [`NameTable`] snapshot. The table is bounded: past [`MAX_NAMES`] distinct names, new names
//! map to [`NameId::OVERFLOW`] so a job that invents names forever cannot grow our memory forever.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// Most distinct names the process-wide table holds.
pub const MAX_NAMES: usize = 1 << 20;

/// Ids from here on stand for `ProfilerStep#N` (N = id − `STEP_IDS`), formatted when resolved and
/// never stored: a step is a new name every time, and a job recording all the time (the flight
/// recorder, a whole-run recording) steps forever, so one table entry per step would grow memory
/// without bound and then fill the table, after which every new kernel name would be lost.
const STEP_IDS: u32 = 1 << 31;

/// An interned name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NameId(pub u32);

impl NameId {
    /// The name given to everything interned after the table filled up.
    pub const OVERFLOW: NameId = NameId(0);

    /// Interns `name` (see [`intern`]).
    pub fn new(name: &str) -> NameId {
        intern(name)
    }

    /// The name this id stands for.
    pub fn resolve(self) -> Arc<str> {
        resolve(self)
    }

    /// The name of step `n`'s `ProfilerStep#n` span, without a table entry (see [`STEP_IDS`]);
    /// a step number past the reserved range is interned as any name.
    pub fn step(n: u64) -> NameId {
        match u32::try_from(n) {
            Ok(n) if n < STEP_IDS => NameId(STEP_IDS + n),
            _ => intern(&format!("ProfilerStep#{n}")),
        }
    }

    /// The step number of an id made by [`NameId::step`].
    pub fn step_number(self) -> Option<u32> {
        self.0.checked_sub(STEP_IDS)
    }
}

struct Interner {
    ids: HashMap<Arc<str>, NameId>,
    names: Vec<Arc<str>>,
}

fn table() -> &'static RwLock<Interner> {
    static TABLE: OnceLock<RwLock<Interner>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let overflow: Arc<str> = Arc::from("<too many distinct names>");
        RwLock::new(Interner {
            ids: HashMap::from([(overflow.clone(), NameId::OVERFLOW)]),
            names: vec![overflow],
        })
    })
}

/// Returns the id for `name`, adding it on first sight.
pub fn intern(name: &str) -> NameId {
    // A poisoned lock only means a panic elsewhere while holding it; the map is still consistent
    // because every mutation below is a single insert.
    if let Some(id) = table()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .ids
        .get(name)
    {
        return *id;
    }
    let mut t = table().write().unwrap_or_else(|e| e.into_inner());
    if let Some(id) = t.ids.get(name) {
        return *id;
    }
    if t.names.len() >= MAX_NAMES {
        return NameId::OVERFLOW;
    }
    let id = NameId(t.names.len() as u32);
    let name: Arc<str> = Arc::from(name);
    t.names.push(name.clone());
    t.ids.insert(name, id);
    id
}

/// Interns a name given as bytes that may not be UTF-8 (CUPTI kernel names are C strings); invalid
/// sequences become U+FFFD.
pub fn intern_bytes(name: &[u8]) -> NameId {
    intern(&String::from_utf8_lossy(name))
}

/// Resolves one id. For many ids take a [`NameTable`] instead.
pub fn resolve(id: NameId) -> Arc<str> {
    if let Some(n) = id.step_number() {
        return Arc::from(format!("ProfilerStep#{n}"));
    }
    let t = table().read().unwrap_or_else(|e| e.into_inner());
    t.names
        .get(id.0 as usize)
        .cloned()
        .unwrap_or_else(|| t.names[0].clone())
}

/// A snapshot of every name interned so far, for resolving many ids without locking.
#[derive(Clone)]
pub struct NameTable {
    names: Vec<Arc<str>>,
}

impl NameTable {
    /// Takes the snapshot.
    pub fn snapshot() -> NameTable {
        NameTable {
            names: table()
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .names
                .clone(),
        }
    }

    /// The name for `id`; ids interned after the snapshot fall back to a lookup.
    pub fn get(&self, id: NameId) -> std::borrow::Cow<'_, str> {
        if let Some(n) = id.step_number() {
            return std::borrow::Cow::Owned(format!("ProfilerStep#{n}"));
        }
        match self.names.get(id.0 as usize) {
            Some(n) => std::borrow::Cow::Borrowed(n),
            None => std::borrow::Cow::Owned(resolve(id).to_string()),
        }
    }
}

/// A runtime/driver API name as Kineto writes it: a `_v` suffix of four or more digits
/// (`cudaLaunchKernel_v7000`, `cuMemAlloc_v3020`) is dropped; shorter ones are part of the name
/// (`cudaStreamGetCaptureInfo_v2`).
pub fn api_name(raw: &str) -> &str {
    if let Some(pos) = raw.rfind("_v") {
        let digits = &raw[pos + 2..];
        if digits.len() >= 4 && digits.bytes().all(|b| b.is_ascii_digit()) {
            return &raw[..pos];
        }
    }
    raw
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_names_lose_long_version_suffixes_only() {
        assert_eq!(
            super::api_name("cudaLaunchKernel_v7000"),
            "cudaLaunchKernel"
        );
        assert_eq!(super::api_name("cuMemAlloc_v3020"), "cuMemAlloc");
        assert_eq!(
            super::api_name("cudaStreamGetCaptureInfo_v2"),
            "cudaStreamGetCaptureInfo_v2"
        );
        assert_eq!(super::api_name("cudaMemcpyAsync"), "cudaMemcpyAsync");
        assert_eq!(super::api_name("cuda_v12ab"), "cuda_v12ab");
    }

    use super::*;

    #[test]
    fn same_name_same_id() {
        let a = intern("aten::mm");
        let b = intern("aten::mm");
        let c = intern("aten::add");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(&*resolve(a), "aten::mm");
        assert_eq!(NameTable::snapshot().get(c), "aten::add");
    }

    #[test]
    fn step_names_take_no_table_entry_and_resolve_to_their_number() {
        let before = table().read().unwrap().names.len();
        for n in [0u64, 1, 12, 1_000_000, u64::from(STEP_IDS) - 1] {
            let id = NameId::step(n);
            assert_eq!(id.step_number(), Some(n as u32));
            assert_eq!(&*resolve(id), format!("ProfilerStep#{n}"));
            assert_eq!(NameTable::snapshot().get(id), format!("ProfilerStep#{n}"));
        }
        // Other tests intern concurrently: a million steps would have added a million entries.
        assert!(table().read().unwrap().names.len() < before + 1000);
        // Past the reserved range a step is an ordinary name.
        let big = NameId::step(u64::from(STEP_IDS));
        assert_eq!(big.step_number(), None);
        assert_eq!(&*resolve(big), format!("ProfilerStep#{STEP_IDS}"));
        assert_eq!(intern("aten::mm").step_number(), None);
    }

    #[test]
    fn non_utf8_names_survive() {
        let id = intern_bytes(b"k\xffernel");
        assert_eq!(&*resolve(id), "k\u{fffd}ernel");
    }
}
