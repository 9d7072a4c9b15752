//! From a buffer's records to linked activities: the External id map, the whole-batch decode
//! that links each activity to its External id, and the layout-driven record iterator for
//! synthetic buffers.

use kinetrace_core::activity::Activity;

use super::{Decoded, Decoder, IntMap, Rec, KINETRACE_EXTERNAL_KIND};
use crate::version::Layout;

/// correlation id → external id, for kinetrace's external-correlation kind. Two generations of at
/// most [`ExternalIds::GENERATION`] entries each, so memory stays bounded while a GPU record that
/// arrives a little after its launch still finds its id.
#[derive(Default)]
pub struct ExternalIds {
    current: IntMap<u32, u64>,
    previous: IntMap<u32, u64>,
}

impl ExternalIds {
    /// Entries per generation.
    pub const GENERATION: usize = 1 << 18;

    /// Remembers that `correlation` belongs to external id `id`.
    pub fn insert(&mut self, correlation: u32, id: u64) {
        if self.current.len() >= Self::GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(correlation, id);
    }

    /// The external id of `correlation`, if known.
    #[inline]
    pub fn get(&self, correlation: u32) -> Option<u64> {
        if self.current.is_empty() && self.previous.is_empty() {
            return None;
        }
        self.current
            .get(&correlation)
            .or_else(|| self.previous.get(&correlation))
            .copied()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Walks a buffer of records by the sizes of `layout` (what `cuptiActivityGetNextRecord` does inside
/// CUPTI), yielding each record's bytes. Stops at a kind whose size the layout does not know. For
/// synthetic buffers (tests, benchmarks); the live pipeline advances with the library's own function.
pub struct RecordIter<'a> {
    buf: &'a [u8],
    layout: Layout,
}

impl<'a> RecordIter<'a> {
    /// Iterates `buf` (the valid bytes of one buffer).
    pub fn new(buf: &'a [u8], layout: Layout) -> Self {
        RecordIter { buf, layout }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let kind = Rec(self.buf).u32(0);
        let size = self.layout.size_of_kind(kind)?;
        if self.buf.len() < size {
            return None;
        }
        let (rec, rest) = self.buf.split_at(size);
        self.buf = rest;
        Some(rec)
    }
}

/// Decodes a whole batch of record slices: external-correlation records fill `ids` first, then every
/// activity is linked to its external id and handed to `emit`. Linking after the batch lets a GPU
/// record whose external-correlation record comes later in the batch still find it.
pub fn decode_batch<'a>(
    decoder: &mut Decoder,
    ids: &mut ExternalIds,
    records: impl IntoIterator<Item = &'a [u8]>,
    pending: &mut Vec<Activity>,
    emit: &mut dyn FnMut(&Activity),
) {
    pending.clear();
    for rec in records {
        match decoder.decode(rec) {
            Decoded::Activity(a) => pending.push(a),
            Decoded::External {
                kind,
                id,
                correlation,
            } if kind == KINETRACE_EXTERNAL_KIND => ids.insert(correlation, id),
            _ => {}
        }
    }
    for a in pending.iter_mut() {
        if let Some(c) = a.correlation {
            a.external_id = ids.get(c as u32);
        }
        decoder.link(a);
        emit(a);
    }
}
