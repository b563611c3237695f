//! What distlock shows while it waits: a spinner on a terminal (name, time
//! waited, holder from `inspect`), nothing otherwise unless `-v`.

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use distlock::{PrimitiveKind, Provider, Wait};
use tokio::time::Instant;

use crate::report::{holders_brief, never_freed};

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// Quick acquisitions show nothing.
const QUIET_START: Duration = Duration::from_millis(200);
const REDRAW: Duration = Duration::from_millis(100);
const REFRESH: Duration = Duration::from_secs(1);

/// Shows the wait for `name` until dropped; never completes.
pub async fn waiting(provider: &dyn Provider, name: &str, kind: PrimitiveKind, wait: Wait) {
    if wait == Wait::No {
        return std::future::pending().await;
    }
    if !std::io::stderr().is_terminal() {
        tokio::time::sleep(QUIET_START).await;
        if let Ok(Ok(snapshot)) = tokio::time::timeout(REFRESH, provider.inspect(name, kind)).await
        {
            tracing::info!(name, holder = %holders_brief(&snapshot), "waiting");
            if let Some(note) = never_freed(&snapshot) {
                tracing::warn!("{note}");
            }
        } else {
            tracing::info!(name, "waiting");
        }
        return std::future::pending().await;
    }
    let started = Instant::now();
    let mut line = Line { drawn: false };
    let mut holder = String::new();
    let mut next_refresh = started + QUIET_START;
    let mut tick = tokio::time::interval(REDRAW);
    for frame in FRAMES.iter().cycle() {
        tick.tick().await;
        let now = Instant::now();
        if now < started + QUIET_START {
            continue;
        }
        if now >= next_refresh {
            holder = match tokio::time::timeout(REFRESH, provider.inspect(name, kind)).await {
                Ok(Ok(snapshot)) => format!(", {}", holders_brief(&snapshot)),
                _ => String::new(),
            };
            next_refresh = Instant::now() + REFRESH;
        }
        line.draw(&format!(
            "{frame} waiting for {kind} {name} ({:.0}s{holder})",
            started.elapsed().as_secs_f64().floor()
        ));
    }
}

/// The spinner's line on stderr, cleared when dropped.
struct Line {
    drawn: bool,
}

impl Line {
    fn draw(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
        self.drawn = true;
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
