//! The tally of CUPTI calls whose failure does not stop recording (`cupti_ignored_errors` in the
//! trace metadata): every such failure is counted by call and code, never dropped silently.

use crate::result::CuptiError;

/// Most distinct (call, code) pairs kept; more are counted together (bounded memory).
const MAX_ENTRIES: usize = 64;

/// Failures by (call, code), since the source started.
#[derive(Debug, Default)]
pub(crate) struct Ignored {
    entries: Vec<(&'static str, CuptiError, u64)>,
    /// Failures beyond [`MAX_ENTRIES`] distinct pairs.
    overflow: u64,
}

impl Ignored {
    /// Counts `r` if it is a failure of `call`.
    pub(crate) fn note<T>(&mut self, call: &'static str, r: Result<T, CuptiError>) {
        if let Err(e) = r {
            self.add(call, e, 1);
        }
    }

    /// Counts `n` failures of `call` with `e`.
    pub(crate) fn add(&mut self, call: &'static str, e: CuptiError, n: u64) {
        if let Some(entry) = self
            .entries
            .iter_mut()
            .find(|(c, code, _)| *c == call && *code == e)
        {
            entry.2 += n;
        } else if self.entries.len() < MAX_ENTRIES {
            self.entries.push((call, e, n));
        } else {
            self.overflow += n;
        }
    }

    /// The metadata value: `call: n × error` for each pair, in the order first seen, then the
    /// failures counted elsewhere (`more`: `(call, times, last error)`). `None` when nothing failed.
    pub(crate) fn render(&self, more: &[(&'static str, u64, CuptiError)]) -> Option<String> {
        let mut parts: Vec<String> = self
            .entries
            .iter()
            .map(|(call, e, n)| format!("{call}: {n} × {e}"))
            .collect();
        parts.extend(
            more.iter()
                .map(|(call, n, e)| format!("{call}: {n} × (last) {e}")),
        );
        if self.overflow > 0 {
            parts.push(format!("{} more failures of other calls", self.overflow));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_call_and_code() {
        let mut i = Ignored::default();
        assert_eq!(i.render(&[]), None);
        i.note("cuptiEnableDomain", Err::<(), _>(CuptiError(15)));
        i.note("cuptiEnableDomain", Ok::<(), _>(()));
        i.note("cuptiEnableDomain", Err::<(), _>(CuptiError(15)));
        i.note("cuptiEnableDomain", Err::<(), _>(CuptiError(1)));
        i.note("cuptiUnsubscribe", Err::<(), _>(CuptiError(1)));
        let text = i.render(&[("cuptiActivityPopExternalCorrelationId", 3, CuptiError(18))]);
        assert_eq!(
            text.as_deref(),
            Some(
                "cuptiEnableDomain: 2 × CUPTI_ERROR_NOT_INITIALIZED (15): CUPTI could not initialise: no usable CUDA driver, or the driver is older than this CUPTI; \
                 cuptiEnableDomain: 1 × CUPTI_ERROR_INVALID_PARAMETER (1); \
                 cuptiUnsubscribe: 1 × CUPTI_ERROR_INVALID_PARAMETER (1); \
                 cuptiActivityPopExternalCorrelationId: 3 × (last) CUPTI_ERROR_QUEUE_EMPTY (18)"
            )
        );
    }

    #[test]
    fn the_tally_is_bounded() {
        let mut i = Ignored::default();
        for code in 0..(MAX_ENTRIES as u32 + 10) {
            i.add("cuptiActivityEnableRuntimeApi", CuptiError(code + 1), 2);
        }
        assert_eq!(i.entries.len(), MAX_ENTRIES);
        assert_eq!(i.overflow, 20);
        assert!(i
            .render(&[])
            .unwrap()
            .ends_with("20 more failures of other calls"));
    }
}
