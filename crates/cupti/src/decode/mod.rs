//! Decoders: CUPTI record bytes → [`Activity`].
//!
//! Each decoder takes one record as `&[u8]` (its real length, as measured between two records the
//! library handed out), checks the length, and reads fields at offsets taken from the bindgen structs
//! of the **oldest** layout that has them (`offset_of!`), which every newer layout shares (the layout
//! test in `kinetrace-cupti-sys` checks this against every supported wheel). Enum-typed fields are
//! read as integers; unknown values map to `Unknown`, never to undefined behaviour. No field newer
//! than 11.8 is needed for the Kineto record model, so no tail field is read.
//!
//! Besides the records that become [`Activity`]s, the decoder keeps what later records and the trace
//! header need: DEVICE records (→ [`Decoder::device_properties`]), CONTEXT records (context id →
//! device id, for `cuda_sync` rows, as Kineto does), CUDA_EVENT records (which stream and which
//! `cudaEventRecord` correlation id last recorded each event, for the `wait_on_*` args of event
//! syncs, as Kineto does), and MEMORY_POOL records (counted; the record model has no place for pool
//! life cycles, see [`PoolStats`]).
//!
//! One private module per record family, each adding its decoders to [`Decoder`]: `kernel`,
//! `copy` (memcpy, peer copy, memset), `api` (runtime, driver), `sync` (synchronization, CUDA
//! event), `memory` (memory2, memory pool), `device` (device, context), `marker` (marker,
//! overhead, external correlation). This module holds the [`Decoder`] and its dispatch by kind,
//! `cstr` the name cache, `batch` the External id linking ([`decode_batch`]) and [`RecordIter`].
//! The decoders are pure: bytes and a [`Layout`] in, records out; no CUPTI call, no I/O.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
#[cfg(test)]
use std::mem::size_of;

use kinetrace_core::activity::*;
use kinetrace_core::intern::{intern, NameId};
use kinetrace_cupti_sys::v12 as base;

use crate::kinds;
use crate::names::ApiNames;
use crate::version::Layout;

/// The external-correlation kind kinetrace pushes: `CUSTOM2`, which PyTorch does not use (it pushes
/// `CUSTOM0` for ops and `CUSTOM1` for user annotations).
pub const KINETRACE_EXTERNAL_KIND: u32 =
    kinetrace_cupti_sys::v13::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

/// A multiply-shift hasher for integer keys (correlation ids, pointers, context ids): the decoder does
/// several map operations per record, and SipHash would dominate its cost.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ *b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// The offset of a field in the oldest layout that has it (`base::Struct.field`). Defined before
/// the family modules so they see it.
macro_rules! off {
    ($t:ident . $f:ident) => {
        offset_of!(base::$t, $f)
    };
}

mod api;
mod batch;
mod copy;
mod cstr;
mod device;
mod kernel;
mod marker;
mod memory;
mod sync;

pub use batch::{decode_batch, ExternalIds, RecordIter};
pub use cstr::CStrNames;
pub use memory::PoolStats;

/// A record view with bounds-checked little-endian reads (out of range reads give 0; the decoders
/// check the length first, so that never happens for accepted records).
#[derive(Clone, Copy)]
struct Rec<'a>(&'a [u8]);

impl Rec<'_> {
    #[inline(always)]
    fn u8(self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }
    #[inline(always)]
    fn u16(self, off: usize) -> u16 {
        match self.0.get(off..off + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => 0,
        }
    }
    #[inline(always)]
    fn u32(self, off: usize) -> u32 {
        match self.0.get(off..off + 4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        }
    }
    #[inline(always)]
    fn u64(self, off: usize) -> u64 {
        match self.0.get(off..off + 8) {
            Some(b) => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => 0,
        }
    }
}

/// What one record decoded to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decoded {
    /// A record for the trace (external id not yet linked).
    Activity(Activity),
    /// A CUDA_EVENT record: `cudaEventRecord` (correlation `correlation`) recorded event `event` of
    /// context `context` on `stream`. Remembered for the `wait_on_*` fields of later event syncs.
    EventRecord {
        /// Context id.
        context: u32,
        /// CUPTI's event id.
        event: u32,
        /// The stream the event was recorded on.
        stream: u32,
        /// The correlation id of the `cudaEventRecord` call.
        correlation: u32,
    },
    /// A DEVICE record for the device with this id (its properties are kept by the decoder).
    Device(u32),
    /// A CONTEXT record: `context` lives on `device`.
    Context {
        /// Context id.
        context: u32,
        /// Device id.
        device: u32,
    },
    /// A MEMORY_POOL record (counted in [`PoolStats`]).
    MemoryPool {
        /// `CUpti_ActivityMemoryPoolOperationType`: 1 created, 2 destroyed, 3 trimmed.
        op: u32,
        /// Device id.
        device: u32,
        /// Pool size after the operation, in bytes.
        size: u64,
    },
    /// An external-correlation record: `correlation` belongs to external id `id` of kind `kind`.
    External {
        /// The external correlation kind.
        kind: u32,
        /// The external id.
        id: u64,
        /// The CUPTI correlation id it applies to.
        correlation: u32,
    },
    /// A record with nothing for the trace: a blocklisted API call, a marker start waiting for its
    /// end, a kind kinetrace does not read.
    Skipped,
    /// Shorter than its kind's base layout: the library is not what it claimed to be.
    TooShort,
}

/// Counters a decoder keeps (for trace metadata and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Records seen.
    pub records: u64,
    /// Records of kinds kinetrace does not read.
    pub unknown_kind: u64,
    /// Records shorter than their base layout.
    pub too_short: u64,
    /// Kernels with `start == end == 0` (the device buffer overflowed; CUPTI documents this).
    pub kernels_without_timestamps: u64,
    /// API records dropped by the noise blocklist.
    pub blocklisted: u64,
    /// Records whose measured length differs from the layout table (a newer library than we know).
    pub size_mismatch: u64,
    /// DEVICE records read.
    pub devices: u64,
    /// CONTEXT records read.
    pub contexts: u64,
    /// CUDA_EVENT records read.
    pub cuda_events: u64,
    /// Event syncs whose awaited `cudaEventRecord` was found (their `wait_on_*` fields are filled).
    pub event_waits_linked: u64,
}

/// Decodes records of one library (one [`Layout`]).
pub struct Decoder {
    layout: Layout,
    names: CStrNames,
    api: ApiNames,
    unknown_name: NameId,
    /// contextId → deviceId, learned from GPU records, to give sync records a device.
    context_device: IntMap<u32, u32>,
    last_context: (u32, u32),
    /// Open marker ranges: id → (start, name, domain, pid, tid).
    open_markers: IntMap<u32, (u64, NameId, Option<NameId>, u32, u32)>,
    /// Devices from DEVICE records, by id.
    devices: Vec<DeviceProperties>,
    /// (contextId << 32 | eventId) → (stream, correlation) of the last `cudaEventRecord` of it.
    event_records: IntMap<u64, (u32, u32)>,
    /// Live memory pools by address: (device, size).
    pools: IntMap<u64, (u32, u64)>,
    pool_stats: PoolStats,
    stats: DecodeStats,
}

/// Most contexts, events and pools the decoder remembers before it starts over (bounded memory).
const MAP_MAX: usize = 1 << 16;
/// Most devices kept.
const DEVICES_MAX: usize = 256;

fn memory_kind(v: u32) -> MemoryKind {
    match v {
        1 => MemoryKind::Pageable,
        2 => MemoryKind::Pinned,
        3 => MemoryKind::Device,
        4 => MemoryKind::Array,
        5 => MemoryKind::Managed,
        6 => MemoryKind::DeviceStatic,
        7 => MemoryKind::ManagedStatic,
        _ => MemoryKind::Unknown,
    }
}

#[inline]
fn nonzero_u32(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

impl Decoder {
    /// A decoder for records of `layout`. `keep_noise` keeps API calls Kineto drops (cudaGetDevice…).
    pub fn new(layout: Layout, names: CStrNames, keep_noise: bool) -> Decoder {
        Decoder {
            layout,
            names,
            api: ApiNames::new(keep_noise),
            unknown_name: intern("<unnamed>"),
            context_device: IntMap::default(),
            last_context: (u32::MAX, u32::MAX),
            open_markers: IntMap::default(),
            devices: Vec::new(),
            event_records: IntMap::default(),
            pools: IntMap::default(),
            pool_stats: PoolStats::default(),
            stats: DecodeStats::default(),
        }
    }

    /// Properties of the devices DEVICE records described, by id.
    pub fn device_properties(&self) -> &[DeviceProperties] {
        &self.devices
    }

    /// The device a context lives on, from CONTEXT records (or GPU records of that context).
    pub fn device_of_context(&self, context: u32) -> Option<u32> {
        self.context_device.get(&context).copied()
    }

    /// What MEMORY_POOL records said so far.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool_stats
    }

    /// The stream and `cudaEventRecord` correlation id that last recorded `event` in `context`.
    pub fn event_record(&self, context: u32, event: u32) -> Option<(u32, u32)> {
        self.event_records
            .get(&((context as u64) << 32 | event as u64))
            .copied()
    }

    /// Fills what a record could not know when it was decoded because the record that tells came
    /// later in the batch: a sync's device (from CONTEXT records) and an event sync's `wait_on_*`
    /// (from CUDA_EVENT records; the last recording of the event wins, as in Kineto).
    pub fn link(&mut self, a: &mut Activity) {
        let Detail::Sync(s) = &mut a.detail else {
            return;
        };
        if s.device.is_none() {
            s.device = s.context.and_then(|c| self.device_of_context(c));
        }
        if matches!(s.kind, SyncKind::EventSync | SyncKind::StreamWaitEvent)
            && s.wait_on_stream.is_none()
        {
            if let (Some(c), Some(e)) = (s.context, s.event_id) {
                if let Some((stream, corr)) = self.event_record(c, e) {
                    s.wait_on_stream = Some(stream);
                    s.wait_on_event_record_correlation = Some(corr as u64);
                    self.stats.event_waits_linked += 1;
                }
            }
        }
    }

    /// The layout this decoder reads.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Counters so far.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Decodes one record. `rec` is the record's bytes (from its first byte to the next record, or the
    /// end of the valid data).
    pub fn decode(&mut self, rec: &[u8]) -> Decoded {
        self.stats.records += 1;
        let r = Rec(rec);
        let kind = r.u32(0);
        if let Some(expected) = self.layout.size_of_kind(kind) {
            // The last record in a buffer can be followed by padding, so only "shorter" is suspicious
            // in general; an exact mismatch is counted for the metadata.
            if rec.len() != expected {
                self.stats.size_mismatch += 1;
            }
        }
        let decoded = match kind {
            kinds::CONCURRENT_KERNEL | kinds::KERNEL => self.kernel(r),
            kinds::MEMCPY => self.memcpy(r),
            kinds::MEMCPY2 => self.memcpy_p2p(r),
            kinds::MEMSET => self.memset(r),
            kinds::RUNTIME | kinds::DRIVER => self.api(r, kind == kinds::RUNTIME),
            kinds::SYNCHRONIZATION => self.sync(r),
            kinds::MEMORY2 => self.memory(r),
            kinds::EXTERNAL_CORRELATION => self.external(r),
            kinds::OVERHEAD => self.overhead(r),
            kinds::MARKER => self.marker(r),
            kinds::MEMORY_POOL => self.memory_pool(r),
            kinds::DEVICE => self.device(r),
            kinds::CONTEXT => self.context(r),
            kinds::CUDA_EVENT => self.cuda_event(r),
            _ => {
                self.stats.unknown_kind += 1;
                Decoded::Skipped
            }
        };
        if decoded == Decoded::TooShort {
            self.stats.too_short += 1;
        }
        decoded
    }

    #[inline]
    fn learn_context(&mut self, context: u32, device: u32) {
        if self.last_context == (context, device) {
            return;
        }
        self.last_context = (context, device);
        if self.context_device.len() < 4096 {
            self.context_device.entry(context).or_insert(device);
        }
    }
}

/// Helpers for the family modules' tests.
#[cfg(test)]
mod test_util {
    use super::*;
    use crate::version::Release;

    /// The bytes of a record struct.
    pub fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: (test) plain-data record structs, fully initialised from Default.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
    }

    /// A decoder for `release` (not keeping noise).
    pub fn decoder(release: Release) -> Decoder {
        // SAFETY: (test) every name pointer in these records is a 'static C string literal.
        Decoder::new(release.layout(), unsafe { CStrNames::new() }, false)
    }
}
