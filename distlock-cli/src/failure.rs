//! Exit codes and the one-line error report.

use std::fmt::Write as _;
use std::io::Write as _;

/// A `distlock: ...` line on stderr; a closed stderr is no reason to panic.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::failure::report_line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// Writes `distlock: ` and `line` on stderr, ignoring write errors.
pub fn report_line(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "distlock: {line}");
}

/// Writes `text` on stdout; `Ok(false)` when the reader has gone (a closed
/// pipe: stop quietly).
pub fn print_out(text: &str) -> Result<bool, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Failure {
            code: SOFTWARE,
            message: format!("writing to stdout: {e}"),
        }),
    }
}

/// sysexits `EX_USAGE`: bad flag, URL, name, option.
pub const USAGE: u8 = 64;
/// sysexits `EX_DATAERR`: what is stored under the name is not what was asked for.
pub const DATA: u8 = 65;
/// sysexits `EX_UNAVAILABLE`: the backend is unreachable or refuses us.
pub const UNAVAILABLE: u8 = 69;
/// sysexits `EX_SOFTWARE`: anything else that went wrong at run time.
pub const SOFTWARE: u8 = 70;
/// sysexits `EX_TEMPFAIL`: the lease was lost while the child ran.
pub const LEASE_LOST: u8 = 75;
/// The command could not be executed (as `env(1)` and shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as `env(1)` and shells).
pub const NOT_FOUND: u8 = 127;

/// Why distlock stops early: an exit code and the line to print.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The line printed after `distlock: ` (nothing when empty).
    pub message: String,
}

impl Failure {
    /// A usage error (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: USAGE,
            message: message.into(),
        }
    }

    /// Signal `sig` arrived before anything ran: exit 128 + N, nothing printed.
    pub fn signalled(sig: i32) -> Self {
        Failure {
            code: u8::try_from(128 + (sig & 0x7f)).unwrap_or(SOFTWARE),
            message: String::new(),
        }
    }

    /// A distlock error, with `context` before its cause chain, coded by its kind.
    pub fn from_error(context: &str, error: &distlock::Error) -> Self {
        let code = if error.is_invalid_input()
            || matches!(error, distlock::Error::Unsupported { .. })
        {
            USAGE
        } else if error.is_not_allowed()
            || error.is_retryable()
            || matches!(error, distlock::Error::Closed)
        {
            UNAVAILABLE
        } else if error.is_conflict() || matches!(error, distlock::Error::PermitsMismatch { .. }) {
            DATA
        } else {
            SOFTWARE
        };
        let chain = chain(error);
        Failure {
            code,
            message: if context.is_empty() {
                chain
            } else {
                format!("{context}: {chain}")
            },
        }
    }
}

/// `error` and its sources, joined by `: `; a source whose text the level
/// above already shows is not repeated.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut previous = line.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !previous.contains(&text) {
            let _ = write!(line, ": {text}");
        }
        previous = text;
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_one_line_with_every_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = distlock::Error::connection("redis", io);
        let f = Failure::from_error("", &e);
        assert_eq!(f.message, "connection to redis failed: Connection refused");
        assert_eq!(f.code, UNAVAILABLE);
        let bad = distlock::Name::new("").unwrap_err();
        assert_eq!(Failure::from_error("x", &bad).code, USAGE);
    }
}
