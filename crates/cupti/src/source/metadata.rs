//! The trace metadata the source adds: what was loaded, what was lost, and every CUPTI failure
//! that did not stop recording.

use super::{callbacks, CuptiConfig, State, POOL};

pub(super) fn metadata(state: &State, config: &CuptiConfig) -> Vec<(String, String)> {
    let mut m = Vec::new();
    match state {
        State::Off { reason, .. } => m.push(("cupti_status".into(), format!("off: {reason}"))),
        State::Live(l) => {
            let i = &l.info;
            m.push(("cupti_version".into(), i.api_version.to_string()));
            m.push(("cupti_release".into(), i.release.to_string()));
            m.push(("cupti_library".into(), i.path.display().to_string()));
            m.push(("cupti_soname".into(), i.soname.clone()));
            if let Some(v) = i.driver.version {
                m.push(("cuda_driver_version".into(), v.to_string()));
            }
            m.push(("cupti_dropped_records".into(), l.cupti_dropped.to_string()));
            let pool = POOL.stats();
            m.push((
                "kinetrace_cupti_discarded_records".into(),
                (l.discarded + pool.discarded_records).to_string(),
            ));
            m.push((
                "kinetrace_cupti_refused_buffers".into(),
                pool.refused.to_string(),
            ));
            let s = l.decoder.stats();
            if s.kernels_without_timestamps > 0 {
                m.push((
                    "cupti_kernels_without_timestamps".into(),
                    s.kernels_without_timestamps.to_string(),
                ));
            }
            if s.too_short + s.size_mismatch > 0 {
                m.push((
                    "cupti_layout_warnings".into(),
                    format!(
                        "{} short, {} unexpected sizes",
                        s.too_short, s.size_mismatch
                    ),
                ));
            }
            if l.yielded {
                m.push((
                    "cupti_subscriber".into(),
                    "held by another CUPTI client (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED): GPU activity is not recorded in this window".into(),
                ));
            }
            if let Some(e) = l.subscribe_error {
                m.push((
                    "cupti_subscribe".into(),
                    format!("failed: {e}; External id links are missing"),
                ));
            }
            if !l.kind_errors.is_empty() {
                let v: Vec<String> = l
                    .kind_errors
                    .iter()
                    .map(|(k, e)| format!("kind {k}: {e}"))
                    .collect();
                m.push(("cupti_kinds_failed".into(), v.join("; ")));
            }
            if !l.refused.is_empty() {
                let v: Vec<String> = l
                    .refused
                    .iter()
                    .map(|(k, got, want)| format!("kind {k}: {got} B, expected {want} B"))
                    .collect();
                m.push(("cupti_kinds_refused".into(), v.join("; ")));
            }
            let p = l.decoder.pool_stats();
            if p.records > 0 {
                m.push((
                    "cupti_memory_pools".into(),
                    format!(
                        "{} records: {} created, {} trimmed, {} destroyed; {} live pools, {} bytes (peak {})",
                        p.records, p.created, p.trimmed, p.destroyed, p.live, p.live_bytes, p.peak_bytes
                    ),
                ));
            }
            if let Some(e) = l.flush_error {
                m.push(("cupti_flush".into(), format!("failed: {e}")));
            }
            if l.late_buffers_window > 0 {
                m.push((
                    "cupti_late_buffers".into(),
                    format!(
                        "{} buffers not returned by CUPTI within {} ms of the end-of-window flush; their records are not in this trace",
                        l.late_buffers_window,
                        config.late_buffer_wait.as_millis()
                    ),
                ));
            }
            if l.late_records > 0 {
                m.push((
                    "cupti_late_records".into(),
                    format!(
                        "{} records (since the source started) came back in buffers after their window's trace was written; counted, not written",
                        l.late_records
                    ),
                ));
            }
            let mut more = callbacks::callback_errors();
            if let (n @ 1.., Some(e)) = pool.count_errors {
                more.push((
                    "cuptiActivityGetNextRecord (counting a reserve buffer)",
                    n,
                    e,
                ));
            }
            if let Some(v) = l.ignored.render(&more) {
                m.push(("cupti_ignored_errors".into(), v));
            }
        }
    }
    m
}
