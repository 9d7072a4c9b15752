//! The few protobuf messages of Perfetto's trace format kinetrace writes, encoded by hand (the
//! field numbers are those of `protos/perfetto/trace/perfetto_trace.proto`). Each message is built
//! into a byte buffer; nesting writes the child's length first, so a child is encoded into its own
//! buffer and appended.

/// Wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

/// A message under construction.
#[derive(Default, Debug, Clone)]
pub struct Msg {
    buf: Vec<u8>,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Msg {
    /// An empty message.
    pub fn new() -> Msg {
        Msg::default()
    }

    fn key(&mut self, field: u32, wire: u32) {
        varint(&mut self.buf, u64::from(field << 3 | wire));
    }

    /// A `uint64`/`uint32`/`enum`/`bool` field.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Msg {
        self.key(field, VARINT);
        varint(&mut self.buf, v);
        self
    }

    /// An `int64`/`int32` field (two's complement, as protobuf's non-zigzag ints).
    pub fn int(&mut self, field: u32, v: i64) -> &mut Msg {
        self.uint(field, v as u64)
    }

    /// A `double` field.
    pub fn double(&mut self, field: u32, v: f64) -> &mut Msg {
        self.fixed64(field, v.to_bits())
    }

    /// A `fixed64` field.
    pub fn fixed64(&mut self, field: u32, v: u64) -> &mut Msg {
        self.key(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `string` or `bytes` field.
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Msg {
        self.key(field, LEN);
        varint(&mut self.buf, v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// A `string` field.
    pub fn str(&mut self, field: u32, v: &str) -> &mut Msg {
        self.bytes(field, v.as_bytes())
    }

    /// A nested message field.
    pub fn msg(&mut self, field: u32, m: &Msg) -> &mut Msg {
        self.bytes(field, &m.buf)
    }

    /// Fields of this message already encoded (another `Msg`'s bytes), appended as they are.
    pub fn raw(&mut self, fields: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(fields);
        self
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// `Trace.packet`.
pub const TRACE_PACKET: u32 = 1;

/// `TracePacket` fields.
pub mod packet {
    /// `uint64 timestamp` (ns, the boot clock by default; kinetrace writes Unix-epoch ns).
    pub const TIMESTAMP: u32 = 8;
    /// `uint32 trusted_packet_sequence_id`.
    pub const SEQUENCE_ID: u32 = 10;
    /// `TrackEvent track_event`.
    pub const TRACK_EVENT: u32 = 11;
    /// `InternedData interned_data`.
    pub const INTERNED_DATA: u32 = 12;
    /// `uint32 sequence_flags`.
    pub const SEQUENCE_FLAGS: u32 = 13;
    /// `TrackDescriptor track_descriptor`.
    pub const TRACK_DESCRIPTOR: u32 = 60;
    /// `SEQ_INCREMENTAL_STATE_CLEARED`.
    pub const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
    /// `SEQ_NEEDS_INCREMENTAL_STATE`.
    pub const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;
}

/// `TrackDescriptor` fields.
pub mod track {
    /// `uint64 uuid`.
    pub const UUID: u32 = 1;
    /// `string name`.
    pub const NAME: u32 = 2;
    /// `ProcessDescriptor process`.
    pub const PROCESS: u32 = 3;
    /// `ThreadDescriptor thread`.
    pub const THREAD: u32 = 4;
    /// `uint64 parent_uuid`.
    pub const PARENT_UUID: u32 = 5;
    /// `ProcessDescriptor.pid`.
    pub const PROCESS_PID: u32 = 1;
    /// `ProcessDescriptor.process_name`.
    pub const PROCESS_NAME: u32 = 6;
    /// `ThreadDescriptor.pid`.
    pub const THREAD_PID: u32 = 1;
    /// `ThreadDescriptor.tid`.
    pub const THREAD_TID: u32 = 2;
    /// `ThreadDescriptor.thread_name`.
    pub const THREAD_NAME: u32 = 5;
}

/// `TrackEvent` fields.
pub mod event {
    /// `repeated uint64 category_iids`.
    pub const CATEGORY_IIDS: u32 = 3;
    /// `repeated DebugAnnotation debug_annotations`.
    pub const DEBUG_ANNOTATIONS: u32 = 4;
    /// `Type type`.
    pub const TYPE: u32 = 9;
    /// `uint64 name_iid`.
    pub const NAME_IID: u32 = 10;
    /// `uint64 track_uuid`.
    pub const TRACK_UUID: u32 = 11;
    /// `repeated fixed64 flow_ids`.
    pub const FLOW_IDS: u32 = 47;
    /// `repeated fixed64 terminating_flow_ids`.
    pub const TERMINATING_FLOW_IDS: u32 = 48;
    /// `TYPE_SLICE_BEGIN`.
    pub const SLICE_BEGIN: u64 = 1;
    /// `TYPE_SLICE_END`.
    pub const SLICE_END: u64 = 2;
    /// `TYPE_INSTANT`.
    pub const INSTANT: u64 = 3;
}

/// `DebugAnnotation` fields.
pub mod annotation {
    /// `bool bool_value`.
    pub const BOOL: u32 = 2;
    /// `uint64 uint_value`.
    pub const UINT: u32 = 3;
    /// `int64 int_value`.
    pub const INT: u32 = 4;
    /// `double double_value`.
    pub const DOUBLE: u32 = 5;
    /// `string string_value`.
    pub const STRING: u32 = 6;
    /// `string name`.
    pub const NAME: u32 = 10;
}

/// `InternedData` fields (each entry: `uint64 iid = 1; string name = 2;`).
pub mod interned {
    /// `repeated EventCategory event_categories`.
    pub const EVENT_CATEGORIES: u32 = 1;
    /// `repeated EventName event_names`.
    pub const EVENT_NAMES: u32 = 2;
    /// `iid`.
    pub const IID: u32 = 1;
    /// `name`.
    pub const NAME: u32 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_encode_as_protobuf_does() {
        let mut m = Msg::new();
        m.uint(1, 300)
            .str(2, "hi")
            .int(3, -1)
            .fixed64(4, 1)
            .double(5, 1.0);
        let b = m.as_bytes();
        assert_eq!(&b[..3], &[0x08, 0xac, 0x02]);
        assert_eq!(&b[3..7], &[0x12, 2, b'h', b'i']);
        assert_eq!(b[7], 0x18);
        assert_eq!(
            &b[8..18],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        assert_eq!(&b[18..27], &[0x21, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[27], 0x29);
        assert_eq!(&b[28..36], &1.0f64.to_le_bytes());
    }
}
