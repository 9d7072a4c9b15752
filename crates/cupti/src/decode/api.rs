//! RUNTIME and DRIVER records (`CUpti_ActivityAPI`, one layout everywhere): names from the cbid
//! tables, Kineto's noise blocklist applied.

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;
use kinetrace_core::UnixNanos;

use super::{base, Decoded, Decoder, Rec};

impl Decoder {
    #[inline]
    pub(super) fn api(&mut self, r: Rec<'_>, runtime: bool) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityAPI>() {
            return Decoded::TooShort;
        }
        let cbid = r.u32(off!(CUpti_ActivityAPI.cbid));
        let Some(info) = self.api.get(runtime, cbid) else {
            self.stats.blocklisted += 1;
            return Decoded::Skipped;
        };
        let call = ApiCall {
            name: info.name,
            cbid: Some(cbid),
            pid: r.u32(off!(CUpti_ActivityAPI.processId)),
            tid: r.u32(off!(CUpti_ActivityAPI.threadId)),
            launches_work: info.launches_work,
            args: Default::default(),
        };
        Decoded::Activity(Activity {
            start: UnixNanos(r.u64(off!(CUpti_ActivityAPI.start))),
            end: UnixNanos(r.u64(off!(CUpti_ActivityAPI.end))),
            correlation: Some(r.u32(off!(CUpti_ActivityAPI.correlationId)) as u64),
            external_id: None,
            detail: if runtime {
                Detail::Runtime(call)
            } else {
                Detail::Driver(call)
            },
        })
    }
}
