//! A `tracing_subscriber::Layer` that records spans as `user_annotation` events.
//!
//! Add it to your own subscriber (`registry().with(KinetraceLayer::new())`); it is not a global and
//! keeps no span table: the name is interned once in `on_new_span` and stored in the span's
//! extensions, and `on_enter`/`on_exit` only read a timestamp and write one ring record. While no
//! profiler is recording, enter and exit cost one relaxed load.

use std::cell::RefCell;

use kinetrace_core::clock::Ticks;
use kinetrace_core::intern::{intern, NameId};
use kinetrace_core::recorder::{self, CpuRecord};
use tracing_core::span::{Attributes, Id};
use tracing_core::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Records `tracing` spans as Kineto `user_annotation` events (or `cpu_op` with
/// [`KinetraceLayer::as_cpu_ops`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct KinetraceLayer {
    cpu_ops: bool,
}

impl KinetraceLayer {
    /// A layer recording spans as user annotations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records spans as `cpu_op` events instead.
    pub fn as_cpu_ops(mut self) -> Self {
        self.cpu_ops = true;
        self
    }
}

/// Private extension type: the interned span name.
struct SpanName(NameId);

thread_local! {
    /// Open enters on this thread: (tracing span id, our External id, the external id it replaced).
    static OPEN: RefCell<Vec<(u64, u64, u64)>> = const { RefCell::new(Vec::new()) };
}

impl<S> Layer<S> for KinetraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut()
                .insert(SpanName(intern(attrs.metadata().name())));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if !recorder::is_active() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let Some(name) = span.extensions().get::<SpanName>().map(|n| n.0) else {
            return;
        };
        let ext = recorder::next_span_id();
        let previous = recorder::push_external_id(ext);
        let _ = OPEN.try_with(|o| {
            if let Ok(mut o) = o.try_borrow_mut() {
                o.push((id.into_u64(), ext, previous));
            }
        });
        recorder::push(CpuRecord::Begin {
            name,
            annotation: !self.cpu_ops,
            python: false,
            start: Ticks::now(),
            id: ext,
            args: kinetrace_core::OpArgs::NONE,
        });
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let span_id = id.into_u64();
        let popped = OPEN
            .try_with(|o| {
                let mut o = o.try_borrow_mut().ok()?;
                let pos = o.iter().rposition(|(s, _, _)| *s == span_id)?;
                Some(o.remove(pos))
            })
            .ok()
            .flatten();
        let Some((_, ext, previous)) = popped else {
            return;
        };
        let end = Ticks::now();
        recorder::restore_external_id(previous);
        recorder::push(CpuRecord::End { end, id: ext });
    }
}
