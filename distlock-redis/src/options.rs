//! Options of a Redis provider, in code or in the URL's query.

use std::time::Duration;

use distlock_core::backend::url::{millis, number, parse_query};
use distlock_core::{Error, LeaseOptions, Result};

/// distlock's own query keys, removed before the client sees the URL.
const OPTION_KEYS: [&str; 10] = [
    "prefix",
    "pool_size",
    "response_timeout_ms",
    "connect_timeout_ms",
    "recheck_ms",
    "lease_ttl_ms",
    "wait_replicas",
    "wait_timeout_ms",
    "owner",
    "fence_retention_ms",
];

/// The query keys the `redis` crate (1.8) reads from a TCP URL (`redis://`,
/// `rediss://`, `valkey://`, `valkeys://`): passed through to it.
pub(crate) const CLIENT_KEYS_TCP: &[&str] = &["protocol"];

/// The query keys the `redis` crate (1.8) reads from a Unix socket URL
/// (`redis+unix://`, `valkey+unix://`, `unix://`): passed through to it.
const CLIENT_KEYS_UNIX: &[&str] = &["protocol", "db", "user", "pass"];

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
/// | `wait_replicas` | [`RedisOptions::wait_for_replicas`]: the number of replicas |
/// | `wait_timeout_ms` | [`RedisOptions::wait_for_replicas`]: the timeout (default 250 ms) |
/// | `owner` | [`RedisOptions::owner_label`] |
/// | `fence_retention_ms` | [`RedisOptions::fence_retention`] |
///
/// The keys the `redis` crate itself reads from the query go through to it
/// unchanged: `protocol` (`resp2`/`resp3`), and on `redis+unix://` also
/// `db`, `user` and `pass`. Any other key, or a key given twice, is an
/// [`Error::InvalidUrl`]: an option is never silently ignored. The same rule
/// holds for `zk://` URLs.
///
/// `Debug` never prints the TLS private key (nor certificate bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) lease: LeaseOptions,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) recheck_interval: Duration,
    pub(crate) pool_size: Option<usize>,
    pub(crate) wait: Option<WaitReplicas>,
    pub(crate) owner_label: Option<String>,
    pub(crate) fence_retention: Duration,
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsOptions,
}

/// Replica acknowledgement asked of every acquisition and renewal: Redis
/// `WAIT replicas timeout` sent with the write, on the same connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// How long a fencing counter outlives the last lease taken or renewed on
/// its name (see [`RedisOptions::fence_retention`]).
pub(crate) const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The bounds of [`RedisOptions::fence_retention`].
pub(crate) const FENCE_RETENTION_RANGE: (Duration, Duration) = (
    Duration::from_millis(100),
    Duration::from_secs(365 * 24 * 3600),
);

/// The replica acknowledgement timeout when only the number is given.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(250);

/// Certificates for `rediss://` beyond the webpki roots (feature `tls`).
#[cfg(feature = "tls")]
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    pub(crate) root_cert: Option<Vec<u8>>,
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

/// Says whether each is set, never their bytes: the client key is a secret.
#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let TlsOptions {
            root_cert,
            client_cert,
        } = self;
        f.debug_struct("TlsOptions")
            .field("root_cert", &root_cert.as_ref().map(|_| "<set>"))
            .field(
                "client_cert",
                &client_cert.as_ref().map(|_| "<set, key redacted>"),
            )
            .finish()
    }
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
            wait: None,
            owner_label: None,
            fence_retention: DEFAULT_FENCE_RETENTION,
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

    /// The label of this provider's owner identity, stored with every hold
    /// and shown by [`Provider::inspect`](distlock_core::Provider::inspect):
    /// `label@host:pid` (without a label: `host:pid`; see
    /// [`owner_identity`](distlock_core::inspect::owner_identity)). Checked
    /// at connect: 1-64 ASCII letters, digits, `-`, `_`, `.`, `:` or `/`,
    /// else [`Error::InvalidOptions`].
    #[must_use]
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.owner_label = Some(label.into());
        self
    }

    /// Lease options of primitives made without explicit ones.
    #[must_use]
    pub fn default_lease(mut self, lease: LeaseOptions) -> Self {
        self.lease = lease;
        self
    }

    /// How long one command may wait for its answer. Default 2 s. It is
    /// also how long the pub/sub connection's health check may take, and
    /// part of how long a dead waiter's place in a line lives (see
    /// [Liveness](crate#liveness)).
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long a name's fencing counter (`{name}:fence`, and the
    /// read-write lock's and semaphore's own) is kept once no lease on the
    /// name can be alive: its TTL is the lease's TTL plus this, set at every
    /// acquisition and renewal, so a name unused for that long leaves no
    /// key behind. Default 24 hours, between 100 ms and 365 days.
    ///
    /// Tokens stay increasing across the counter's expiry: a token is at
    /// least the server's `TIME` in microseconds, so the next one after the
    /// expiry is above every earlier one unless the server's clock was set
    /// back, between the two, by more than the retention (see
    /// [Fencing tokens](crate#fencing-tokens)).
    #[must_use]
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.fence_retention = retention;
        self
    }

    /// The TTL of a fencing counter beside a lease of `lease_ms`: the lease
    /// and the retention, in milliseconds.
    pub(crate) fn fence_ttl_ms(&self, lease_ms: u64) -> u64 {
        let retention = u64::try_from(self.fence_retention.as_millis()).unwrap_or(u64::MAX);
        lease_ms.saturating_add(retention)
    }

    /// The TTL of a fencing counter a force-release advances (no lease is
    /// left alive): the retention, in milliseconds.
    pub(crate) fn fence_retention_ms(&self) -> u64 {
        self.fence_ttl_ms(0)
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
    /// The pub/sub connection is health-checked as often, at most every
    /// second, while anyone waits (see [Liveness](crate#liveness)).
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

    /// Waits for `replicas` replicas to acknowledge every acquisition and
    /// every renewal (Redis `WAIT replicas timeout`, sent in one pipeline
    /// with the write on the same connection), so a lock the master hands
    /// out survives the master's loss when a replica that has it is promoted
    /// (Sentinel, or a Cluster shard's failover, where it waits on the
    /// shard of the lock's key).
    ///
    /// * An acquisition that fewer replicas acknowledged within `timeout` is
    ///   undone (compare-and-delete on the same connection, before the call
    ///   returns) and fails with the retryable
    ///   [`Error::NotReplicated`]; it is never reported as "not acquired",
    ///   so "replicas are behind" and "the lock is busy" stay apart.
    ///   `lock()` and `lock_timeout()` keep trying, as through any
    ///   retryable failure, and report `NotReplicated` at their deadline;
    ///   `try_lock()` reports it at once.
    /// * A renewal that fewer replicas acknowledged counts as failed: the
    ///   guard turns `Suspended`, the watchdog retries, and the lease is lost
    ///   at the expiry of the last acknowledged renewal.
    /// * Releases and queue bookkeeping are not waited for (a release the
    ///   replica missed only leaves a lease to expire).
    ///
    /// `replicas` 0 turns it off. `timeout` must be at least 1 ms (Redis
    /// reads 0 as "forever") and below half the response timeout, so that a
    /// refusal arrives as `NotReplicated` and not as a timeout of the whole
    /// command. Scripts followed by a `WAIT` are sent as `EVAL` (with their
    /// body), so a restarted server's `NOSCRIPT` never costs a second `WAIT`. Every command
    /// on the connection waits behind a `WAIT` in progress, so with replicas
    /// down each acquisition costs up to `timeout`: keep it short. What `WAIT`
    /// does not give: it is not consensus. A replica that acknowledged can
    /// still lose the failover election to one that did not (Sentinel prefers
    /// the replica with the largest replication offset, which is one that
    /// acknowledged, unless it is down); see SAFETY.md for the measured
    /// failover experiment.
    #[must_use]
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = (replicas > 0).then_some(WaitReplicas { replicas, timeout });
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

    /// Refuses TLS certificates for a mode that does not use them (Sentinel
    /// and Redlock connect over plain TCP), rather than ignoring them.
    pub(crate) fn refuse_tls(&self, mode: &str) -> Result<()> {
        #[cfg(feature = "tls")]
        if self.tls != TlsOptions::default() {
            return Err(Error::InvalidOptions(format!(
                "{mode} connects over plain TCP: TLS certificates are not supported there"
            )));
        }
        let _ = mode;
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(label) = &self.owner_label {
            distlock_core::inspect::check_label(label)?;
        }
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
        let (least, most) = FENCE_RETENTION_RANGE;
        if self.fence_retention < least || self.fence_retention > most {
            return Err(Error::InvalidOptions(format!(
                "fence retention must be between 100 ms and 365 days, got {:?}",
                self.fence_retention
            )));
        }
        if self.pool_size == Some(0) {
            return Err(Error::InvalidOptions("pool size must be at least 1".into()));
        }
        if let Some(wait) = self.wait {
            // Room for the command's own round trip and a slow server.
            if wait.timeout < Duration::from_millis(1)
                || wait.timeout.saturating_mul(2) >= self.response_timeout
            {
                return Err(Error::InvalidOptions(format!(
                    "the replica acknowledgement timeout ({:?}) must be at least 1 ms and below half the response timeout ({:?})",
                    wait.timeout, self.response_timeout
                )));
            }
        }
        Ok(())
    }

    /// Splits distlock's own query keys off `url`: the URL for the client
    /// (with the query keys the `redis` crate reads, and any `#fragment`),
    /// and these options updated.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a value that does not parse, a key that
    /// neither distlock nor the `redis` crate reads, or a key given twice;
    /// [`Error::InvalidOptions`] for a lease TTL out of range. Messages show
    /// the URL with its password replaced by `***`.
    pub fn from_url(self, url: &str) -> Result<(String, Self)> {
        let (main, fragment) = url.find('#').map_or((url, ""), |i| url.split_at(i));
        let Some((base, query)) = main.split_once('?') else {
            return Ok((url.to_owned(), self));
        };
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        let client_keys = if matches!(
            scheme.to_ascii_lowercase().as_str(),
            "redis+unix" | "valkey+unix" | "unix"
        ) {
            CLIENT_KEYS_UNIX
        } else {
            CLIENT_KEYS_TCP
        };
        let (options, rest) = self.apply_query(url, query, client_keys)?;
        let url = if rest.is_empty() {
            format!("{base}{fragment}")
        } else {
            format!("{base}?{}{fragment}", rest.join("&"))
        };
        Ok((url, options))
    }

    /// Applies distlock's keys of `query` (from `url`, named in errors) and
    /// returns the `client_keys` pairs, as `key=value`, for the client.
    pub(crate) fn apply_query(
        mut self,
        url: &str,
        query: &str,
        client_keys: &[&str],
    ) -> Result<(Self, Vec<String>)> {
        let known: Vec<&str> = OPTION_KEYS.iter().chain(client_keys).copied().collect();
        let mut rest = Vec::new();
        let mut wait_replicas = None;
        let mut wait_timeout = None;
        for (key, value) in parse_query(url, query, &known)? {
            match key {
                "prefix" => self.prefix = value.to_owned(),
                "pool_size" => self.pool_size = Some(number(url, key, value)?),
                "response_timeout_ms" => self.response_timeout = millis(url, key, value)?,
                "connect_timeout_ms" => self.connect_timeout = millis(url, key, value)?,
                "recheck_ms" => self.recheck_interval = millis(url, key, value)?,
                "lease_ttl_ms" => self.lease = LeaseOptions::new(millis(url, key, value)?)?,
                "wait_replicas" => wait_replicas = Some(number(url, key, value)?),
                "wait_timeout_ms" => wait_timeout = Some(millis(url, key, value)?),
                "owner" => self.owner_label = Some(value.to_owned()),
                "fence_retention_ms" => self.fence_retention = millis(url, key, value)?,
                _ => rest.push(format!("{key}={value}")),
            }
        }
        match (wait_replicas, wait_timeout) {
            (Some(replicas), timeout) => {
                let timeout = timeout
                    .or(self.wait.map(|w| w.timeout))
                    .unwrap_or(DEFAULT_WAIT_TIMEOUT);
                self = self.wait_for_replicas(replicas, timeout);
            }
            (None, Some(timeout)) => match self.wait {
                Some(wait) => self = self.wait_for_replicas(wait.replicas, timeout),
                None => {
                    return Err(distlock_core::backend::url::invalid_url(
                        url,
                        "wait_timeout_ms needs wait_replicas",
                    ))
                }
            },
            (None, None) => {}
        }
        Ok((self, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_query_sets_options_and_keeps_the_clients_keys() {
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
        let (url, o) = RedisOptions::new()
            .from_url("rediss://h:1/?response_timeout_ms=300&connect_timeout_ms=400&lease_ttl_ms=900#insecure")
            .unwrap();
        assert_eq!(url, "rediss://h:1/#insecure");
        assert_eq!(o.response_timeout, Duration::from_millis(300));
        assert_eq!(o.connect_timeout, Duration::from_millis(400));
        assert_eq!(o.lease.ttl(), Duration::from_millis(900));
        let (url, _) = RedisOptions::new()
            .from_url("redis+unix:///tmp/r.sock?db=2&pass=pw&user=u&protocol=3&prefix=x")
            .unwrap();
        assert_eq!(
            url,
            "redis+unix:///tmp/r.sock?db=2&pass=pw&user=u&protocol=3"
        );
        for plain in ["redis://h:1", "redis://h:1/0?", "redis://h:1/0#insecure"] {
            let (url, o) = RedisOptions::new().from_url(plain).unwrap();
            assert_eq!(
                (url.as_str(), o),
                (plain.trim_end_matches('?'), RedisOptions::new())
            );
        }
    }

    #[test]
    fn unknown_and_repeated_keys_are_rejected_with_the_password_hidden() {
        for (url, says) in [
            // Keys redis-rs does not read from a TCP URL's query: it would
            // silently ignore them (db 0 instead of 2, no password).
            ("redis://u:s3cret@h:1?db=2", "unknown option \"db\""),
            ("redis://u:s3cret@h:1?pass=x", "unknown option \"pass\""),
            (
                "redis://:s3cret@h:1?prefix=a&nope=1",
                "unknown option \"nope\"",
            ),
            (
                "rediss://u:s3cret@h:1?timeout=5",
                "unknown option \"timeout\"",
            ),
            (
                "redis+unix:///r.sock?pass=s3cret&tls=1",
                "unknown option \"tls\"",
            ),
            ("redis://u:s3cret@h:1?prefix=a&prefix=b", "given twice"),
            ("redis://u:s3cret@h:1?protocol=3&protocol=2", "given twice"),
            (
                "redis://u:s3cret@h:1?pool_size=x",
                "pool_size=\"x\" is not a number",
            ),
            (
                "redis://u:s3cret@h:1?recheck_ms=1s",
                "not a whole number of milliseconds",
            ),
        ] {
            let e = RedisOptions::new().from_url(url).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
            assert!(!format!("{e:?}").contains("s3cret"), "{url}: {e:?}");
        }
        let e = RedisOptions::new()
            .from_url("redis://h?nope=1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("known: prefix, pool_size, response_timeout_ms, connect_timeout_ms, recheck_ms, lease_ttl_ms, wait_replicas, wait_timeout_ms, owner, fence_retention_ms, protocol"),
            "{e}"
        );
    }

    #[cfg(feature = "cluster")]
    #[tokio::test]
    async fn cluster_urls_follow_the_same_rule() {
        for (url, says) in [
            (
                "redis+cluster://u:s3cret@h:1,h:2?db=1",
                "unknown option \"db\"",
            ),
            (
                "redis+cluster://u:s3cret@h:1?prefix=a&prefix=b",
                "given twice",
            ),
            ("redis+cluster://u:s3cret@h:1?recheck_ms=x", "milliseconds"),
            ("redis+cluster://u:s3cret@?prefix=a", "no seed node"),
            ("redis+cluster://u:s3cret@,/", "no seed node"),
        ] {
            let Err(e) = crate::connect(url).await else {
                panic!("{url} accepted");
            };
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(
                text.contains(says) && text.contains("u:***@"),
                "{url}: {text}"
            );
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
        // Known keys pass the rule; nothing listens on port 1.
        let url = "redis+cluster://127.0.0.1:1?protocol=resp3&connect_timeout_ms=500";
        let Err(e) = crate::connect(url).await else {
            panic!("connected to nothing");
        };
        assert!(!e.is_invalid_input(), "{e:?}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_certificates_are_refused_where_they_would_be_ignored() {
        let o = RedisOptions::new().tls_root_cert(b"ROOT".to_vec());
        assert!(matches!(
            o.refuse_tls("redis+redlock"),
            Err(Error::InvalidOptions(m)) if m.contains("redis+redlock")
        ));
        RedisOptions::new().refuse_tls("redis+redlock").unwrap();
    }

    #[cfg(feature = "tls")]
    #[test]
    fn debug_hides_the_tls_key() {
        let o = RedisOptions::new()
            .tls_root_cert(b"ROOT-CERT-BYTES".to_vec())
            .tls_client_cert(b"CLIENT-CERT-BYTES".to_vec(), b"PRIVATE-KEY-BYTES".to_vec());
        let shown = format!("{o:?} {o:#?}");
        for secret in ["PRIVATE-KEY-BYTES", "CLIENT-CERT-BYTES", "ROOT-CERT-BYTES"] {
            assert!(!shown.contains(secret), "{shown}");
            let bytes = format!("{:?}", secret.as_bytes());
            assert!(!shown.contains(&bytes[1..bytes.len() - 1]), "{shown}");
        }
        assert!(shown.contains("key redacted"), "{shown}");
    }

    #[test]
    fn replica_acknowledgement_from_the_query() {
        let (_, o) = RedisOptions::new()
            .from_url("redis://h:1?wait_replicas=2")
            .unwrap();
        let wait = o.wait.unwrap();
        assert_eq!((wait.replicas, wait.timeout), (2, DEFAULT_WAIT_TIMEOUT));
        o.validate().unwrap();
        let (_, o) = RedisOptions::new()
            .from_url("redis://h:1?wait_timeout_ms=40&wait_replicas=1")
            .unwrap();
        assert_eq!(
            o.wait,
            Some(WaitReplicas {
                replicas: 1,
                timeout: Duration::from_millis(40)
            })
        );
        // The query's timeout overrides the one set in code; 0 replicas is off.
        let coded = RedisOptions::new().wait_for_replicas(1, Duration::from_millis(30));
        let (_, o) = coded
            .clone()
            .from_url("redis://h:1?wait_timeout_ms=70")
            .unwrap();
        assert_eq!(o.wait.unwrap().timeout, Duration::from_millis(70));
        let (_, o) = coded.from_url("redis://h:1?wait_replicas=0").unwrap();
        assert_eq!(o.wait, None);
        for (url, says) in [
            ("redis://h:1?wait_timeout_ms=5", "needs wait_replicas"),
            ("redis://h:1?wait_replicas=-1", "not a number"),
            ("redis://h:1?wait_replicas=1&wait_replicas=2", "given twice"),
        ] {
            let e = RedisOptions::new().from_url(url).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUrl(m) if m.contains(says)),
                "{url}: {e:?}"
            );
        }
        for bad in [
            RedisOptions::new().wait_for_replicas(1, Duration::ZERO),
            RedisOptions::new().wait_for_replicas(1, Duration::from_secs(2)),
            RedisOptions::new()
                .response_timeout(Duration::from_millis(100))
                .wait_for_replicas(1, Duration::from_millis(50)),
        ] {
            assert!(matches!(bad.validate(), Err(Error::InvalidOptions(_))));
        }
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
