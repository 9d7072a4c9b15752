//! SYNCHRONIZATION records (Synchronization prefix) and the CUDA_EVENT records that tell which
//! stream and `cudaEventRecord` an event sync waits on.

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::UnixNanos;

use super::{base, Decoded, Decoder, Rec, MAP_MAX};

fn sync_kind(v: u32) -> SyncKind {
    match v {
        1 => SyncKind::EventSync,
        2 => SyncKind::StreamWaitEvent,
        3 => SyncKind::StreamSync,
        4 => SyncKind::ContextSync,
        _ => SyncKind::Unknown,
    }
}

impl Decoder {
    #[inline]
    pub(super) fn sync(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivitySynchronization>() {
            return Decoded::TooShort;
        }
        // CUPTI writes CUPTI_SYNCHRONIZATION_INVALID_VALUE (u32::MAX) for fields that do not apply.
        let valid = |v: u32| (v != u32::MAX).then_some(v);
        let context = valid(r.u32(off!(CUpti_ActivitySynchronization.contextId)));
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivitySynchronization.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivitySynchronization.end))),
            correlation: Some(r.u32(off!(CUpti_ActivitySynchronization.correlationId)) as u64),
            external_id: None,
            detail: Detail::Sync(Sync {
                kind: sync_kind(r.u32(off!(CUpti_ActivitySynchronization.type_))),
                // Looked up from CONTEXT records (and GPU records) now, and again in `link`.
                device: context.and_then(|c| self.device_of_context(c)),
                context,
                stream: valid(r.u32(off!(CUpti_ActivitySynchronization.streamId))),
                event_id: valid(r.u32(off!(CUpti_ActivitySynchronization.cudaEventId))),
                wait_on_stream: None,
                wait_on_event_record_correlation: None,
            }),
        })
    }

    #[inline]
    pub(super) fn cuda_event(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityCudaEvent>() {
            return Decoded::TooShort;
        }
        let context = r.u32(off!(CUpti_ActivityCudaEvent.contextId));
        let event = r.u32(off!(CUpti_ActivityCudaEvent.eventId));
        let stream = r.u32(off!(CUpti_ActivityCudaEvent.streamId));
        let correlation = r.u32(off!(CUpti_ActivityCudaEvent.correlationId));
        self.stats.cuda_events += 1;
        let key = (context as u64) << 32 | event as u64;
        if self.event_records.len() >= MAP_MAX && !self.event_records.contains_key(&key) {
            self.event_records.clear();
        }
        self.event_records.insert(key, (stream, correlation));
        Decoded::EventRecord {
            context,
            event,
            stream,
            correlation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{bytes, decoder};
    use super::super::*;
    use crate::kinds;
    use crate::version::Release;
    use kinetrace_cupti_sys::v12;

    fn sync(kind: u32, context: u32, stream: u32, event: u32, corr: u32) -> Vec<u8> {
        bytes(&v12::CUpti_ActivitySynchronization2 {
            kind: kinds::SYNCHRONIZATION,
            type_: kind,
            start: 10,
            end: 20,
            correlationId: corr,
            contextId: context,
            streamId: stream,
            cudaEventId: event,
            ..Default::default()
        })
    }

    fn sync_detail(a: &Activity) -> Sync {
        match a.detail {
            Detail::Sync(s) => s,
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn event_syncs_find_the_event_record_and_the_device_even_later_in_the_batch() {
        let mut d = decoder(Release::V12_9);
        let mut ids = ExternalIds::default();
        let ctx = bytes(&v12::CUpti_ActivityContext3 {
            kind: kinds::CONTEXT,
            contextId: 5,
            deviceId: 2,
            ..Default::default()
        });
        let event = |event: u32, stream: u32, corr: u32| {
            bytes(&v12::CUpti_ActivityCudaEvent2 {
                kind: kinds::CUDA_EVENT,
                correlationId: corr,
                contextId: 5,
                streamId: stream,
                eventId: event,
                ..Default::default()
            })
        };
        // Waits come first in the buffer; the records that explain them after.
        let recs = [
            sync(2, 5, 3, 9, 100),
            sync(1, 5, u32::MAX, 9, 101),
            sync(2, 5, 3, 77, 102), // an event never recorded
            sync(3, 5, 3, u32::MAX, 103),
            event(9, 4, 50),
            ctx,
        ];
        let mut out = Vec::new();
        let mut pending = Vec::new();
        decode_batch(
            &mut d,
            &mut ids,
            recs.iter().map(Vec::as_slice),
            &mut pending,
            &mut |a| out.push(sync_detail(a)),
        );
        assert_eq!(out.len(), 4);
        for s in &out[..2] {
            assert_eq!(
                (
                    s.wait_on_stream,
                    s.wait_on_event_record_correlation,
                    s.event_id
                ),
                (Some(4), Some(50), Some(9))
            );
            assert_eq!(s.device, Some(2));
        }
        assert_eq!(out[0].kind, SyncKind::StreamWaitEvent);
        assert_eq!(out[1].stream, None);
        assert_eq!((out[2].wait_on_stream, out[2].event_id), (None, Some(77)));
        assert_eq!((out[3].wait_on_stream, out[3].event_id), (None, None));
        assert_eq!(out[3].device, Some(2));
        assert_eq!(d.stats().event_waits_linked, 2);
        assert_eq!(d.stats().size_mismatch, 0);

        // A later recording of the same event wins for later waits; the old 24-byte CudaEvent
        // layout (11.8 – 12.6) is read too.
        let mut old = decoder(Release::V11_8);
        let v1 = bytes(&v12::CUpti_ActivityCudaEvent {
            kind: kinds::CUDA_EVENT,
            correlationId: 60,
            contextId: 5,
            streamId: 8,
            eventId: 9,
            ..Default::default()
        });
        assert_eq!(
            old.decode(&v1),
            Decoded::EventRecord {
                context: 5,
                event: 9,
                stream: 8,
                correlation: 60
            }
        );
        assert_eq!(old.event_record(5, 9), Some((8, 60)));
        assert_eq!(
            old.event_record(6, 9),
            None,
            "keyed by context, as in Kineto"
        );
        assert_eq!(old.decode(&v1[..20]), Decoded::TooShort);
        assert_eq!(
            d.decode(&event(9, 6, 70)),
            Decoded::EventRecord {
                context: 5,
                event: 9,
                stream: 6,
                correlation: 70
            }
        );
        assert_eq!(d.event_record(5, 9), Some((6, 70)));
    }
}
