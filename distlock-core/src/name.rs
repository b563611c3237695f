//! The validated, backend-portable name of a lock, election or id generator.

use std::fmt;

use crate::error::{Error, Result};

/// A validated name, valid for every backend.
///
/// # Rule
///
/// * 1 to [`Name::MAX_LEN`] bytes;
/// * one or more segments separated by `/`; no leading, trailing or doubled
///   `/`; no segment is `.` or `..`;
/// * each segment uses only ASCII letters, digits, `-`, `_`, `.` and `:`.
///
/// # Mapping to backends
///
/// * **Redis**: the lock key is the configured prefix followed by the name,
///   byte for byte (`orders/42` with an empty prefix is the key `orders/42`),
///   so other clients (redis-py's `Lock("orders/42")`) can share it.
///   Auxiliary keys wrap the name in a hash tag (`{orders/42}:fence`); since a
///   name never contains braces, they hash to the lock key's cluster slot.
/// * **ZooKeeper**: each segment is one node under the provider's base path
///   (`orders/42` is `/<base>/orders/42`); the lock's children live below it.
/// * **In-process**: the name is the key of a map.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// The longest name accepted, in bytes.
    pub const MAX_LEN: usize = 200;

    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when `name` breaks the rule above.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let s = name.as_ref();
        validate(s).map_err(|reason| Error::InvalidName {
            name: s.chars().take(64).collect(),
            reason,
        })?;
        Ok(Name(s.to_owned()))
    }

    /// The name as a string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated segments of the name.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// This name followed by `/` and `suffix`, validated.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the result is not a valid name.
    pub fn join(&self, suffix: &str) -> Result<Self> {
        Name::new(format!("{}/{suffix}", self.0))
    }
}

fn validate(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.len() > Name::MAX_LEN {
        return Err("longer than 200 bytes");
    }
    for segment in s.split('/') {
        if segment.is_empty() {
            return Err("empty segment (leading, trailing or doubled '/')");
        }
        if segment == "." || segment == ".." {
            return Err("segment '.' or '..'");
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err("only ASCII letters, digits, '-', '_', '.', ':' and '/' are allowed");
        }
    }
    Ok(())
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Name {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        Name::new(s)
    }
}

impl TryFrom<String> for Name {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Name::new(s)
    }
}

impl std::str::FromStr for Name {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Name::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_portable_names() {
        for ok in ["a", "orders/42", "svc:payments/lock-1", "a.b_c-d", "x/y/z"] {
            assert_eq!(Name::new(ok).unwrap().as_str(), ok);
        }
        assert!(Name::new("a".repeat(Name::MAX_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_names_with_typed_error() {
        let long = "a".repeat(Name::MAX_LEN + 1);
        for bad in [
            "", "/a", "a/", "a//b", ".", "a/../b", "a b", "{a}", "a\0b", "ä", "a*", "\n", &long,
        ] {
            match Name::new(bad) {
                Err(Error::InvalidName { .. }) => {}
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn segments_and_join() {
        let n = Name::new("a/b").unwrap();
        assert_eq!(n.segments().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(n.join("c").unwrap().as_str(), "a/b/c");
        assert!(n.join("").is_err());
    }
}
