//! Options of a ZooKeeper provider, in code or in the `zk://` URL.

use std::time::Duration;

use distlock_core::{Error, Result};

/// How a [`ZkProvider`](crate::ZkProvider) connects and where it keeps its
/// nodes.
///
/// From a URL: `zk://[user:password@]host:port[,host:port…][/chroot][?options]`
/// with the query keys `session_timeout_ms`, `connect_timeout_ms`,
/// `operation_timeout_ms` and `base` (the base path under the chroot).
#[derive(Clone, Debug)]
pub struct ZkOptions {
    pub(crate) hosts: String,
    pub(crate) root: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) digest: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::TlsOptions>,
}

impl ZkOptions {
    /// The default base path under the chroot: `/distlock`.
    pub const DEFAULT_BASE: &'static str = "/distlock";

    /// Options for the ensemble `hosts` (`host:port[,host:port…]`), with a 6 s
    /// session timeout, 5 s connect timeout, 6 s operation timeout, base path
    /// `/distlock`, no authentication.
    #[must_use]
    pub fn new(hosts: impl Into<String>) -> Self {
        ZkOptions {
            hosts: hosts.into(),
            root: Self::DEFAULT_BASE.to_owned(),
            session_timeout: Duration::from_secs(6),
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(6),
            digest: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Parses `zk://[user:password@]h:p[,h:p…][/chroot][?options]`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when it does not parse.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidUrl(format!("{url:?}: {why}"));
        let rest = url
            .strip_prefix("zk://")
            .or_else(|| url.strip_prefix("zookeeper://"))
            .ok_or_else(|| bad("expected zk://"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hosts, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if hosts.is_empty()
            || hosts.split(',').any(|h| {
                h.rsplit_once(':')
                    .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
            })
        {
            return Err(bad("hosts must be host:port[,host:port…]"));
        }
        let mut options = ZkOptions::new(hosts);
        let chroot = chroot.trim_end_matches('/');
        let mut base = Self::DEFAULT_BASE.to_owned();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let ms = || {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| bad(&format!("{key} must be a number of milliseconds")))
            };
            match key {
                "session_timeout_ms" => options.session_timeout = ms()?,
                "connect_timeout_ms" => options.connect_timeout = ms()?,
                "operation_timeout_ms" => options.operation_timeout = ms()?,
                "base" => base = value.trim_end_matches('/').to_owned(),
                other => return Err(bad(&format!("unknown option {other:?}"))),
            }
        }
        options.root = format!("{chroot}{base}");
        if let Some(auth) = auth {
            options.digest = Some(auth.to_owned());
        }
        options.validate()?;
        Ok(options)
    }

    /// The path under which every node lives (chroot + base; default
    /// `/distlock`). Must be an absolute path of valid segments, or empty
    /// for the root.
    #[must_use]
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into().trim_end_matches('/').to_owned();
        self
    }

    /// Session timeout to negotiate (the server clamps it to its limits).
    #[must_use]
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long establishing a session may take.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may take.
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Authenticates with the `digest` scheme as `user:password`. Nodes are
    /// then created with the creator-only ACL, so only sessions authenticated
    /// as the same user can touch them; without it, nodes are open to
    /// everyone (as Curator's default).
    #[must_use]
    pub fn digest(mut self, user: &str, password: &str) -> Self {
        self.digest = Some(format!("{user}:{password}"));
        self
    }

    /// TLS options for the connection (feature `tls`). Build them after
    /// [`install_crypto_provider`], or with your own provider installed.
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(mut self, tls: crate::TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.root.is_empty() {
            let valid = self.root.starts_with('/')
                && self.root[1..].split('/').all(|s| {
                    !s.is_empty()
                        && s != "."
                        && s != ".."
                        && s.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')
                        })
                });
            if !valid {
                return Err(Error::InvalidOptions(format!(
                    "root path {:?} must be absolute with segments of letters, digits, '-', '_', '.', ':'",
                    self.root
                )));
            }
        }
        for (what, d) in [
            ("session timeout", self.session_timeout),
            ("connect timeout", self.connect_timeout),
            ("operation timeout", self.operation_timeout),
        ] {
            distlock_core::lease::check_setting(what, d)?;
        }
        if self.digest.as_deref().is_some_and(|d| !d.contains(':')) {
            return Err(Error::InvalidOptions(
                "digest credentials must be user:password".into(),
            ));
        }
        Ok(())
    }
}

/// Installs ring as rustls's process-wide crypto provider, unless one is
/// installed already (feature `tls`).
///
/// rustls cannot pick a provider by itself when more than one is compiled in,
/// which happens as soon as features unify across a workspace (zookeeper-client
/// brings aws-lc-rs, other crates ring); building TLS options then panics
/// inside rustls. distlock calls this before it connects with TLS; call it
/// yourself before building [`TlsOptions`](crate::TlsOptions) if you build
/// them first.
#[cfg(feature = "tls")]
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let o = ZkOptions::from_url(
            "zk://u:p@127.0.0.1:2181,127.0.0.1:2182/app?session_timeout_ms=4000&base=/locks",
        )
        .unwrap();
        assert_eq!(o.hosts, "127.0.0.1:2181,127.0.0.1:2182");
        assert_eq!(o.root, "/app/locks");
        assert_eq!(o.session_timeout, Duration::from_secs(4));
        assert_eq!(o.digest.as_deref(), Some("u:p"));
        let o = ZkOptions::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(o.root, "/distlock");
        let o = ZkOptions::from_url("zk://127.0.0.1:2181/?base=").unwrap();
        assert_eq!(o.root, "");
    }

    #[test]
    fn bad_urls_and_options_are_typed_errors() {
        for bad in [
            "zk://",
            "zk://host",
            "zk://host:port",
            "zk://:2181",
            "redis://h:1",
            "zk://h:1?nope=1",
            "zk://h:1?session_timeout_ms=x",
        ] {
            assert!(
                matches!(ZkOptions::from_url(bad), Err(Error::InvalidUrl(_))),
                "{bad}"
            );
        }
        for bad in [
            "zk://h:1/a b",
            "zk://h:1/a//b",
            "zk://h:1?session_timeout_ms=0",
        ] {
            assert!(
                matches!(ZkOptions::from_url(bad), Err(Error::InvalidOptions(_))),
                "{bad}"
            );
        }
    }
}
