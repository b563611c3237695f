//! Captures `tracing` events (every level) as text, to check what the
//! library logs: that acquire and release events carry the owner identity,
//! and that nothing logs a secret such as a Redis lock's token value.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// One captured event: its message and `field=value` pairs, space separated.
pub type Line = String;

#[derive(Default)]
struct Capture {
    lines: Mutex<Vec<Line>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={}", field.name(), value);
    }
}

struct Global(Arc<Capture>);

impl Subscriber for Global {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fields.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

fn capture() -> &'static Arc<Capture> {
    static CAPTURE: OnceLock<Arc<Capture>> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Arc::new(Capture::default());
        tracing::subscriber::set_global_default(Global(Arc::clone(&capture)))
            .expect("another tracing subscriber is installed in this test binary");
        capture
    })
}

/// Installs the capturing subscriber for the whole test binary (once).
pub fn install() {
    capture();
}

/// Every event captured so far that contains `needle`.
pub fn lines_with(needle: &str) -> Vec<Line> {
    capture()
        .lines
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}
