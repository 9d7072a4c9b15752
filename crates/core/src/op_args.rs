//! The args of framework ops beyond their name, interned: one text per distinct set of
//! members (PyTorch's `"Input Dims":[[4, 8]],"Input type":["float"],…` and a collective's
//! `"Collective name":"allreduce",…`), written into an op's `args` as they are.
//!
//! Ops carry an [`ArgsId`] (4 bytes) so a ring record stays fixed-size; the recorder hands the
//! same text back for the same shapes, so each distinct text is stored once. Unlike names, these
//! texts hold values that change as a job runs (a learning rate in `Concrete Inputs`), so the table
//! is emptied whenever the session goes idle ([`reset`]): ids carry the table's generation, and an
//! id from an earlier generation resolves to nothing (its op is written without these args) rather
//! than to another op's text. The table is also bounded ([`MAX_ARGS`], [`MAX_ARGS_BYTES`]): past
//! either, new texts are refused and counted ([`refused`]), and their ops go without them.
//!
//! The texts are trusted to be well-formed JSON members: whoever interns them checks them first
//! (the shim validates what the compiled recorder hands over).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// Most distinct texts one generation holds.
pub const MAX_ARGS: usize = 1 << 20;
/// Most bytes of text one generation holds.
pub const MAX_ARGS_BYTES: usize = 64 << 20;

/// Bits of an id that index the table; the rest are the generation.
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
const GENERATIONS: u32 = 1 << (32 - INDEX_BITS);

/// An interned args text of one generation of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArgsId(pub u32);

impl ArgsId {
    fn generation(self) -> u32 {
        self.0 >> INDEX_BITS
    }

    fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
    }
}

struct Table {
    generation: u32,
    ids: HashMap<Arc<str>, ArgsId>,
    texts: Vec<Arc<str>>,
    bytes: usize,
}

fn table() -> &'static RwLock<Table> {
    static TABLE: OnceLock<RwLock<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        RwLock::new(Table {
            generation: 1,
            ids: HashMap::new(),
            texts: Vec::new(),
            bytes: 0,
        })
    })
}

/// The generation ids are made in now (1..=255, then around again), readable without the lock:
/// a caller that caches ids (the compiled recorder) drops them when this changes. Relaxed: a
/// reader that sees the change late hands over an id of the earlier generation, which resolves to
/// nothing (the op loses these args, never gets another's).
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// Texts refused since the process started because the table was full (Relaxed: a statistic).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The id of `text`, adding it on first sight; `None` when the table is full.
pub fn intern(text: &str) -> Option<ArgsId> {
    {
        // A poisoned lock only means a panic elsewhere while holding it; every mutation below
        // leaves the table consistent.
        let t = table().read().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = t.ids.get(text) {
            return Some(*id);
        }
    }
    let mut t = table().write().unwrap_or_else(|e| e.into_inner());
    if let Some(id) = t.ids.get(text) {
        return Some(*id);
    }
    if t.texts.len() >= MAX_ARGS || t.bytes + text.len() > MAX_ARGS_BYTES {
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let id = ArgsId((t.generation << INDEX_BITS) | t.texts.len() as u32);
    let text: Arc<str> = Arc::from(text);
    t.bytes += text.len();
    t.texts.push(text.clone());
    t.ids.insert(text, id);
    Some(id)
}

/// The text of `id`, if it belongs to the current generation.
pub fn resolve(id: ArgsId) -> Option<Arc<str>> {
    let t = table().read().unwrap_or_else(|e| e.into_inner());
    if id.generation() != t.generation {
        return None;
    }
    t.texts.get(id.index()).cloned()
}

/// The current generation (see [`GENERATION`]).
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Relaxed)
}

/// Empties the table and starts a new generation. The session calls it when it goes idle: no
/// window is open or waiting, so no record still to be written holds an id of this generation.
pub fn reset() {
    let mut t = table().write().unwrap_or_else(|e| e.into_inner());
    if t.texts.is_empty() {
        return;
    }
    // 0 is never a generation, so the id 0 is never valid.
    t.generation = t.generation % (GENERATIONS - 1) + 1;
    t.ids = HashMap::new();
    t.texts = Vec::new();
    t.bytes = 0;
    GENERATION.store(t.generation, Ordering::Relaxed);
}

/// Texts refused so far because the table was full.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is process-wide: the tests that reset it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn same_text_same_id_until_reset() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = intern(r#""Input Dims":[[4, 8]]"#).unwrap();
        let b = intern(r#""Input Dims":[[4, 8]]"#).unwrap();
        let c = intern(r#""Input Dims":[[8]]"#).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.generation(), generation());
        assert_eq!(resolve(c).as_deref(), Some(r#""Input Dims":[[8]]"#));
        reset();
        // An id of the earlier generation resolves to nothing, not to the text now at its index.
        let d = intern(r#""Input Dims":[[1]]"#).unwrap();
        assert_eq!(resolve(a), None);
        assert_eq!(resolve(c), None);
        assert_eq!(resolve(d).as_deref(), Some(r#""Input Dims":[[1]]"#));
        assert_ne!(d.generation(), a.generation());
        assert_eq!(d.generation(), generation());
    }

    #[test]
    fn generations_wrap_without_zero() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = std::collections::HashSet::new();
        for i in 0..300 {
            let id = intern(&format!("\"n\":{i}")).unwrap();
            assert_ne!(id.generation(), 0);
            assert_ne!(id.0, 0);
            seen.insert(id.generation());
            reset();
        }
        assert_eq!(seen.len(), (GENERATIONS - 1) as usize);
    }

    #[test]
    fn a_full_table_refuses_and_counts() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let before = refused();
        let huge = "x".repeat(MAX_ARGS_BYTES + 1);
        assert_eq!(intern(&huge), None);
        assert_eq!(refused(), before + 1);
        assert!(intern(r#""Input Dims":[]"#).is_some());
    }
}
