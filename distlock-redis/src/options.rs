//! Options of a Redis provider, in code or in the URL's query.

use std::time::Duration;

use distlock_core::{Error, LeaseOptions, Result};

/// How a [`RedisProvider`](crate::RedisProvider) connects and names its keys.
///
/// Every option can also be given in the connection URL's query, which
/// distlock removes before the client sees it:
///
/// | query key | option |
/// |---|---|
/// | `prefix` | [`RedisOptions::key_prefix`] |
/// | `pool_size` | [`RedisOptions::pool_size`] |
/// | `response_timeout_ms` | [`RedisOptions::response_timeout`] |
/// | `connect_timeout_ms` | [`RedisOptions::connect_timeout`] |
/// | `recheck_ms` | [`RedisOptions::recheck_interval`] |
/// | `lease_ttl_ms` | [`RedisOptions::default_lease`] (watchdog at TTL/3) |
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) lease: LeaseOptions,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) recheck_interval: Duration,
    pub(crate) pool_size: Option<usize>,
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsOptions,
}

/// Certificates for `rediss://` beyond the webpki roots (feature `tls`).
#[cfg(feature = "tls")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    pub(crate) root_cert: Option<Vec<u8>>,
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: String::new(),
            lease: LeaseOptions::default(),
            response_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            recheck_interval: Duration::from_millis(500),
            pool_size: None,
            #[cfg(feature = "tls")]
            tls: TlsOptions::default(),
        }
    }
}

impl RedisOptions {
    /// The defaults: empty prefix, 30 s lease with watchdog, 2 s response
    /// timeout, 5 s connect timeout, 500 ms re-check, one multiplexed
    /// connection.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Prepended to every key. The lock key is exactly prefix + name, so a
    /// redis-py `Lock(prefix + name)` shares the lock. Default empty. Must
    /// not contain `{`, `}` or whitespace, at most 100 bytes.
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease options of primitives made without explicit ones.
    #[must_use]
    pub fn default_lease(mut self, lease: LeaseOptions) -> Self {
        self.lease = lease;
        self
    }

    /// How long one command may wait for its answer. Default 2 s.
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long opening a connection may take. Default 5 s.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often a waiter re-checks the lock by itself, besides the release
    /// message and the holder's expiry: it bounds how late a release by a
    /// client that does not publish (redis-py) is noticed. Default 500 ms.
    #[must_use]
    pub fn recheck_interval(mut self, interval: Duration) -> Self {
        self.recheck_interval = interval;
        self
    }

    /// Use a deadpool-redis pool of `size` connections instead of one
    /// multiplexed connection. Each checkout costs deadpool's health check
    /// (one `PING` round trip), so prefer the default unless you need the
    /// isolation.
    #[must_use]
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = Some(size);
        self
    }

    /// Trusts the CA certificate `pem` (PEM) for `rediss://` instead of the
    /// webpki roots (feature `tls`).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate and private key (both PEM) for
    /// mutual TLS (feature `tls`).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_cert = Some((cert_pem.into(), key_pem.into()));
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.prefix.len() > 100
            || self
                .prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        {
            return Err(Error::InvalidOptions(
                "key prefix must be at most 100 bytes without braces, whitespace or control characters"
                    .into(),
            ));
        }
        for (what, d) in [
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
            ("recheck interval", self.recheck_interval),
        ] {
            distlock_core::lease::check_setting(what, d)?;
        }
        if self.pool_size == Some(0) {
            return Err(Error::InvalidOptions("pool size must be at least 1".into()));
        }
        Ok(())
    }

    /// Splits distlock's own query keys off `url`: the URL for the client,
    /// and these options updated.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a value that does not parse.
    pub fn from_url(mut self, url: &str) -> Result<(String, Self)> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), self));
        };
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let ms = || {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| Error::InvalidUrl(format!("{key}={value:?} is not a number")))
            };
            match key {
                "prefix" => self.prefix = value.to_owned(),
                "pool_size" => {
                    self.pool_size = Some(value.parse().map_err(|_| {
                        Error::InvalidUrl(format!("pool_size={value:?} is not a number"))
                    })?);
                }
                "response_timeout_ms" => self.response_timeout = ms()?,
                "connect_timeout_ms" => self.connect_timeout = ms()?,
                "recheck_ms" => self.recheck_interval = ms()?,
                "lease_ttl_ms" => self.lease = LeaseOptions::new(ms()?)?,
                _ => rest.push(pair),
            }
        }
        let url = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        Ok((url, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_query_sets_options_and_keeps_the_rest() {
        let (url, o) = RedisOptions::new()
            .from_url(
                "redis://u:p@127.0.0.1:6379/2?prefix=app:&pool_size=4&protocol=resp3&recheck_ms=50",
            )
            .unwrap();
        assert_eq!(url, "redis://u:p@127.0.0.1:6379/2?protocol=resp3");
        assert_eq!(o.prefix, "app:");
        assert_eq!(o.pool_size, Some(4));
        assert_eq!(o.recheck_interval, Duration::from_millis(50));
        o.validate().unwrap();
    }

    #[test]
    fn bad_options_are_typed_errors() {
        assert!(matches!(
            RedisOptions::new().from_url("redis://h?pool_size=x"),
            Err(Error::InvalidUrl(_))
        ));
        assert!(matches!(
            RedisOptions::new().from_url("redis://h?lease_ttl_ms=0"),
            Err(Error::InvalidOptions(_))
        ));
        for bad in [
            RedisOptions::new().key_prefix("{x}"),
            RedisOptions::new().key_prefix("a b"),
            RedisOptions::new().pool_size(0),
            RedisOptions::new().response_timeout(Duration::ZERO),
            RedisOptions::new().recheck_interval(Duration::MAX),
        ] {
            assert!(matches!(bad.validate(), Err(Error::InvalidOptions(_))));
        }
    }
}
