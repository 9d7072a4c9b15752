/*!
A fake `libcupti` for tests (never shipped). It implements the CUPTI entry points kinetrace calls,
reports the version chosen by `FAKE_CUPTI_VERSION` (18 = 11.8, 20 = 12.2, 21 = 12.3, 22 = 12.4,
23 = 12.5, 24 = 12.6, 26 = 12.8, 27/28 = 12.9, `xxyyzz` = 13.yy from 130000; default 28), and
writes records with the **real struct layouts of that release** (the bindgen structs of
`kinetrace-cupti-sys`, chosen per kind by the research table of which struct each release writes)
into buffers obtained through the registered request callback, completing them through the
completion callback when full (rollover) or flushed.

The simulated machine has two devices (0 and 1) with one context each (1 on device 0, 2 on device
1). The driver initialises at the first CUDA call: DEVICE records are written then if DEVICE is
enabled, and CONTEXT records when a context is first used if CONTEXT is enabled; later,
`cuptiActivityEnableAndDump` writes records for the devices and contexts that exist (as CUPTI does).
The first launch of each kernel name writes a lazy-function-loading OVERHEAD record.
`cuptiActivityGetStructSize` answers from the same table for 13.2+ (`CUPTI_ERROR_NOT_SUPPORTED`
before: real libraries before 13.2 do not export it).

Workloads are driven by the test through `fake_cupti_*` entry points that behave like CUDA calls made
on the calling thread: API enter/exit callbacks to the subscriber, external-correlation records for
the calling thread's pushed ids, the API record, and the GPU records.

Fault injection (environment, read once):
- `FAKE_CUPTI_FAIL=cuptiActivityEnable,cuptiActivityFlushAll,...` — those entry points fail with
  `FAKE_CUPTI_FAIL_CODE` (default 15, NOT_INITIALIZED); `*` fails every entry point but
  `cuptiGetVersion`.
- `FAKE_CUPTI_DROP_EVERY=N` — every Nth GPU record is dropped and reported by
  `cuptiActivityGetNumDroppedRecords`.
- `FAKE_CUPTI_SUBSCRIBE_REFUSED=1` — `cuptiSubscribe` always answers 39 (another tool, such as
  Nsight Systems, holds CUPTI for the whole run).
- `FAKE_CUPTI_LATE_MS=N` — completed buffers are handed back from another thread N ms later.
- `FAKE_CUPTI_SLOW_READER_NS=N` — `cuptiActivityGetNumDroppedRecords` spins N ns after reading the
  count: a collector that falls behind right after it (preempted on a loaded machine), so CUPTI runs
  out of buffers and drops records while the collector holds them all.
- `FAKE_CUPTI_HOLD=1` — completed buffers are held back until the test calls
  `fake_cupti_release_held()` (a buffer CUPTI returns as late as the test decides).
- `FAKE_CUPTI_WRONG_STRUCT_SIZE=KIND` — `cuptiActivityGetStructSize` reports 8 bytes more than the
  real size for that kind (records are still written in the real layout).
- `cuptiActivityGetNextRecord` in `FAKE_CUPTI_FAIL` makes the record iterator fail from the first
  record of every buffer (with `FAKE_CUPTI_FAIL_CODE=21`: CUPTI's answer at an incomplete record).

CUPTI before 13.3 allows one subscriber per process, and so does the fake: a second `cuptiSubscribe`
answers 39 (`CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`) until the first unsubscribes, and
`cuptiUnsubscribe` only accepts the handle of the current subscriber. `fake_cupti_foreign_subscribe`
/ `fake_cupti_foreign_unsubscribe` subscribe and unsubscribe another client the way PyTorch's Kineto
does (`TEARDOWN_CUPTI=1`, or older Kineto). The exit callback of a call goes to whoever is subscribed
when the call returns, so a client that unsubscribed during a call gets no exit callback for it.

`cuptiActivityGetNumDroppedRecords` answers the global queue's count for a null context (all buffers
have been global since CUDA 6.0) and 0 for any other context.

It also exports `cuDriverGetVersion`, so tests can point kinetrace's driver check at this file.

Modules: [`faults`] (the environment), [`machine`] (buffers, devices, subscriber, one API call),
[`records`] (record bytes per release, from `kinetrace-cupti-sys`'s release → struct table, the
same table kinetrace reads), [`workload`] (the `fake_cupti_*` entry points tests call) and
[`exports`] (the CUPTI C ABI).
*/
#![deny(missing_docs)]
#![allow(clippy::missing_safety_doc)]

pub mod exports;
pub mod faults;
pub mod machine;
pub mod records;
pub mod workload;

pub use workload::FakeStats;

const SUCCESS: u32 = 0;
const INVALID_PARAMETER: u32 = 1;
const MAX_LIMIT_REACHED: u32 = 12;
const MULTIPLE_SUBSCRIBERS: u32 = 39;
