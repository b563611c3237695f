//! Connection URLs as the backends read them: credentials redacted from
//! everything printed, and one rule for query options.
//!
//! The rule for a query (`?key=value&key=value`), on every backend: every
//! key must be one the backend knows (its own options, and on Redis the few
//! keys the `redis` crate reads), each at most once; values are taken as
//! written (no percent-decoding). Anything else is an
//! [`Error::InvalidUrl`] naming the key, never silently ignored.
//!
//! For backend crates; applications have no use for it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// What a hidden secret is replaced with.
const HIDDEN: &str = "***";

/// Query keys whose values are secrets (`redis+unix://…?pass=…`); compared
/// without case, after percent-decoding.
const SECRET_KEYS: &[&str] = &["pass", "password"];

/// `url` with the password of its userinfo (and any `pass=` or
/// `password=` query value) replaced by `***`, for error messages and logs:
/// `redis://u:pw@h` → `redis://u:***@h`, `zk://u:pw@h1,h2/x` →
/// `zk://u:***@h1,h2/x`. A URL without credentials comes back unchanged.
///
/// Works on any string, also malformed ones. The password runs from the
/// first `:` after the scheme to the **last** `@` of the whole string, so a
/// password that itself holds `@`, `/`, `?` or `#` stays hidden; the price
/// is that an `@` in a query value (`?prefix=a@b`) hides more than needed.
/// When in doubt it hides more, never less.
#[must_use]
pub fn redact(url: &str) -> String {
    let start = match url.find("://") {
        Some(i)
            if url[..i]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) =>
        {
            i + 3
        }
        // No scheme: credentials may still come first (`u:pw@host`).
        _ => 0,
    };
    let rest = &url[start..];
    let mut shown = String::with_capacity(url.len());
    shown.push_str(&url[..start]);
    match rest.rfind('@') {
        Some(at) if rest[..at].contains(':') => {
            let colon = rest.find(':').unwrap_or(at);
            shown.push_str(&rest[..=colon]);
            shown.push_str(HIDDEN);
            shown.push_str(&rest[at..]);
        }
        _ => shown.push_str(rest),
    }
    match shown[start..].find('?') {
        None => shown,
        Some(q) => {
            let (head, query) = shown.split_at(start + q + 1);
            let mut out = head.to_owned();
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key, _)) if is_secret_key(key) => {
                        out.push_str(key);
                        out.push('=');
                        out.push_str(HIDDEN);
                    }
                    _ => out.push_str(pair),
                }
            }
            out
        }
    }
}

fn is_secret_key(key: &str) -> bool {
    let decoded = percent_decode(key);
    SECRET_KEYS.iter().any(|s| decoded.eq_ignore_ascii_case(s))
}

/// `%XX` sequences decoded byte-wise; anything else kept as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push(u8::try_from(h * 16 + l).unwrap_or(0));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An [`Error::InvalidUrl`] for `url` (redacted, quoted) and why it is
/// refused.
#[must_use]
pub fn invalid_url(url: &str, why: impl fmt::Display) -> Error {
    Error::InvalidUrl(format!("{:?}: {why}", redact(url)))
}

/// Splits `query` (the part of `url` after `?`, without any `#fragment`)
/// into its `key=value` pairs, in order, as written. A pair without `=` has
/// an empty value; empty pairs (`&&`, a trailing `&`) are skipped.
///
/// # Errors
///
/// [`Error::InvalidUrl`] (with `url` redacted) for a key not in `known`,
/// listing the known ones, or a key given twice.
pub fn parse_query<'q>(
    url: &str,
    query: &'q str,
    known: &[&str],
) -> Result<Vec<(&'q str, &'q str)>> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&key) {
            return Err(if known.is_empty() {
                invalid_url(url, format_args!("unknown option {key:?}: none is known"))
            } else {
                invalid_url(
                    url,
                    format_args!("unknown option {key:?} (known: {})", known.join(", ")),
                )
            });
        }
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(invalid_url(
                url,
                format_args!("option {key:?} is given twice"),
            ));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// The value of query option `key` as a whole number of milliseconds.
///
/// # Errors
///
/// [`Error::InvalidUrl`] (with `url` redacted) when it is not one. Range
/// checks (zero, too long) are the options' own, as for options set in
/// code.
pub fn millis(url: &str, key: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            invalid_url(
                url,
                format_args!("{key}={value:?} is not a whole number of milliseconds"),
            )
        })
}

/// The value of query option `key` as a number of type `T`.
///
/// # Errors
///
/// [`Error::InvalidUrl`] (with `url` redacted) when it does not parse.
pub fn number<T: FromStr>(url: &str, key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| invalid_url(url, format_args!("{key}={value:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        for (url, want) in [
            ("redis://u:pw@h", "redis://u:***@h"),
            ("redis://:pw@h", "redis://:***@h"),
            ("zk://u:pw@h1,h2/x", "zk://u:***@h1,h2/x"),
            (
                "zk://u:pw@h1:1,h2:2/x?base=/y",
                "zk://u:***@h1:1,h2:2/x?base=/y",
            ),
            (
                "rediss://u:p@ss@h:1/0?protocol=3",
                "rediss://u:***@h:1/0?protocol=3",
            ),
            ("redis://u:p/w@h", "redis://u:***@h"),
            ("zk://u:pa?ss@h:1", "zk://u:***@h:1"),
            ("zk://u:a@b?c@d@h:1", "zk://u:***@h:1"),
            // An '@' in a query value: more hidden than needed, never less.
            ("redis://u:pw@h?prefix=a@b", "redis://u:***@b"),
            ("redis://h:1?prefix=a@b", "redis://h:***@b"),
            ("redis://u:pa#ss@h:1", "redis://u:***@h:1"),
            ("u:pw@h:1", "u:***@h:1"),
            ("user:pw@host://x", "user:***@host://x"),
            (
                "redis+cluster://u:pw@h1:1,u:pw@h2:2",
                "redis+cluster://u:***@h2:2",
            ),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=pw&user=u",
                "redis+unix:///tmp/r.sock?db=1&pass=***&user=u",
            ),
            ("unix:///s?PASSWORD=pw#x", "unix:///s?PASSWORD=***"),
            ("unix:///s?p%61ss=pw", "unix:///s?p%61ss=***"),
            ("unix:///s?pass=a@b", "unix:///s?pass=***"),
            ("redis://u:pw@h?pass=x&q", "redis://u:***@h?pass=***&q"),
            // Without credentials: unchanged.
            (
                "redis://127.0.0.1:6379/2?protocol=resp3",
                "redis://127.0.0.1:6379/2?protocol=resp3",
            ),
            ("zk://h1:1,h2:2/app", "zk://h1:1,h2:2/app"),
            ("redis://u@h", "redis://u@h"),
            ("mem://", "mem://"),
            ("", ""),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    /// A small deterministic generator, so the fuzz loop needs no
    /// dependency.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            usize::try_from(self.0 % n as u64).unwrap_or(0)
        }

        fn string(&mut self, alphabet: &[&str], max: usize) -> String {
            (0..self.below(max + 1))
                .map(|_| alphabet[self.below(alphabet.len())])
                .collect()
        }
    }

    #[test]
    fn no_input_panics_and_no_password_survives() {
        let odd = [
            "@", ":", "/", "?", "#", "&", "=", "%", "%4", "%zz", "://", "a", "é", "🦀", "\0", " ",
            "[", "]", "pass", "u", "h", "1",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let _ = redact(&rng.string(&odd, 24));
        }
        // The password itself may hold anything but the marker never
        // appears in the output, whatever follows the '@'.
        let schemes = ["redis://", "zk://", "rediss://", "", "x+y://"];
        let secret = ["S3cr3t", "@", ":", "/", "?", "#", "&", "=", "é", "%40"];
        let after = [
            "h", ":", "1", ",", "/", "?", "=", "&", "@", "#", "base", "é",
        ];
        for _ in 0..20_000 {
            let scheme = schemes[rng.below(schemes.len())];
            let user = rng.string(&["u", "é", "%", "-"], 4);
            let password = format!("S3cr3t{}", rng.string(&secret, 8));
            let tail = rng.string(&after, 16);
            let url = format!("{scheme}{user}:{password}@{tail}");
            let shown = redact(&url);
            assert!(!shown.contains("S3cr3t"), "{url} -> {shown}");
            let e = invalid_url(&url, "bad");
            assert!(!e.to_string().contains("S3cr3t"), "{e}");
        }
    }

    #[test]
    fn one_query_rule() {
        let url = "zk://u:pw@h:1?a=1&&b&c=x=y&";
        assert_eq!(
            parse_query(url, "a=1&&b&c=x=y&", &["a", "b", "c"]).unwrap(),
            [("a", "1"), ("b", ""), ("c", "x=y")]
        );
        for (query, says) in [
            ("a=1&nope=2", "unknown option \"nope\" (known: a, b)"),
            ("a=1&a=2", "option \"a\" is given twice"),
            ("=1", "unknown option \"\""),
        ] {
            let e = parse_query(url, query, &["a", "b"]).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(says), "{text}");
            assert!(text.contains("u:***@h:1") && !text.contains("pw"), "{text}");
        }
        assert!(parse_query(url, "x=1", &[])
            .unwrap_err()
            .to_string()
            .contains("none is known"));
    }

    #[test]
    fn values_are_typed() {
        let url = "redis://:pw@h";
        assert_eq!(
            millis(url, "t_ms", "250").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(number::<usize>(url, "n", "4").unwrap(), 4);
        for e in [
            millis(url, "t_ms", "1.5").unwrap_err(),
            millis(url, "t_ms", "-1").unwrap_err(),
            millis(url, "t_ms", "").unwrap_err(),
            number::<usize>(url, "n", "x").unwrap_err(),
        ] {
            assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
            assert!(!e.to_string().contains("pw"), "{e}");
            assert!(e.is_invalid_input());
        }
    }
}
