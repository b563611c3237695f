//! Options of a ZooKeeper provider, in code or in the `zk://` URL.

use std::fmt;
use std::time::Duration;

use distlock_core::backend::url::{invalid_url, millis, parse_query};
use distlock_core::{Error, Result};

/// The query keys of a `zk://` URL.
const OPTION_KEYS: &[&str] = &[
    "session_timeout_ms",
    "connect_timeout_ms",
    "operation_timeout_ms",
    "base",
    "owner",
];

/// How a [`ZkProvider`](crate::ZkProvider) connects and where it keeps its
/// nodes.
///
/// From a URL: `zk://[user:password@]host:port[,host:port…][/chroot][?options]`
/// with the query keys `session_timeout_ms`, `connect_timeout_ms`,
/// `operation_timeout_ms`, `base` (the base path under the chroot) and
/// `owner` (the owner label, see [`ZkOptions::owner_label`]). Any
/// other key, or a key given twice, is an [`Error::InvalidUrl`] (the rule
/// `redis://` URLs follow too).
///
/// Neither `Debug` nor an error message shows the digest password.
#[derive(Clone)]
pub struct ZkOptions {
    pub(crate) hosts: String,
    pub(crate) root: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) digest: Option<String>,
    pub(crate) owner_label: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::TlsOptions>,
}

impl ZkOptions {
    /// The default base path under the chroot: `/distlock`.
    pub const DEFAULT_BASE: &'static str = "/distlock";

    /// Options for the ensemble `hosts` (`host:port[,host:port…]`), with a 6 s
    /// session timeout, 5 s connect timeout, 6 s operation timeout, base path
    /// `/distlock`, no authentication. The hosts may end in a chroot
    /// (`host:port[,host:port…]/app`), which the client applies to every
    /// path: the nodes then live under chroot + [root](ZkOptions::root),
    /// which must not be in ZooKeeper's own `/zookeeper` subtree (checked
    /// when connecting).
    #[must_use]
    pub fn new(hosts: impl Into<String>) -> Self {
        ZkOptions {
            hosts: hosts.into(),
            root: Self::DEFAULT_BASE.to_owned(),
            session_timeout: Duration::from_secs(6),
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(6),
            digest: None,
            owner_label: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Parses `zk://[user:password@]h:p[,h:p…][/chroot][?options]`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when it does not parse, or names an unknown
    /// option or one twice (the message shows the URL with its password
    /// replaced by `***`); [`Error::InvalidOptions`] for values out of range.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| invalid_url(url, why);
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
        if hosts.is_empty() {
            return Err(bad("no host: hosts must be host:port[,host:port…]"));
        }
        // Which part of which server is wrong, not only that one is.
        for h in hosts.split(',') {
            let Some((host, port)) = h.rsplit_once(':') else {
                return Err(bad(&format!(
                    "server {h:?} has no port: hosts must be host:port[,host:port…]"
                )));
            };
            if host.is_empty() {
                return Err(bad(&format!("server {h:?} has no host")));
            }
            if !port.parse::<u16>().is_ok_and(|p| p > 0) {
                return Err(bad(&format!(
                    "port {port:?} of server {h:?} is not a number from 1 to 65535"
                )));
            }
        }
        let mut options = ZkOptions::new(hosts);
        let chroot = chroot.trim_end_matches('/');
        let mut base = Self::DEFAULT_BASE.to_owned();
        for (key, value) in parse_query(url, query, OPTION_KEYS)? {
            match key {
                "session_timeout_ms" => options.session_timeout = millis(url, key, value)?,
                "connect_timeout_ms" => options.connect_timeout = millis(url, key, value)?,
                "operation_timeout_ms" => options.operation_timeout = millis(url, key, value)?,
                "owner" => options.owner_label = Some(value.to_owned()),
                _ => {
                    // An empty base would put every name at the top of the
                    // tree (`zookeeper/…` in ZooKeeper's own subtree), and
                    // one without its `/` would run into the chroot's last
                    // segment (`/app` + `locks` = `/applocks`).
                    if value.trim_end_matches('/').is_empty() {
                        return Err(bad(
                            "option \"base\" is empty: give a path such as /distlock, or \
                             leave it out for the default",
                        ));
                    }
                    if !value.starts_with('/') {
                        return Err(bad(&format!(
                            "option \"base\" {value:?} must begin with '/' (such as /distlock)"
                        )));
                    }
                    base = value.trim_end_matches('/').to_owned();
                }
            }
        }
        options.root = format!("{chroot}{base}");
        if let Some(auth) = auth {
            if auth
                .split_once(':')
                .is_some_and(|(user, _)| user.is_empty())
            {
                return Err(bad(
                    "the digest user is empty: credentials are user:password",
                ));
            }
            options.digest = Some(auth.to_owned());
        }
        options.validate()?;
        Ok(options)
    }

    /// The path under which every node lives (chroot + base; default
    /// `/distlock`). Must be an absolute path of valid segments, not the
    /// tree's root (names would be top-level nodes, `zookeeper/…` among
    /// them) and not in ZooKeeper's own `/zookeeper` subtree.
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

    /// The owner label: the provider's owner identity, stored in the data of
    /// every node it holds with (see the crate docs, "Inspect and
    /// force-release"), becomes `label@host:pid` instead of `host:pid`.
    /// Checked when connecting ([`check_label`](distlock_core::inspect::check_label):
    /// 1-64 ASCII letters, digits, `-`, `_`, `.`, `:`, `/`).
    #[must_use]
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.owner_label = Some(label.into());
        self
    }

    /// The owner identity these options give a provider: `host:pid`, or
    /// `label@host:pid` with an [owner label](ZkOptions::owner_label).
    pub(crate) fn owner(&self) -> Result<String> {
        distlock_core::inspect::owner_identity(self.owner_label.as_deref())
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
        if self.root.is_empty() {
            return Err(Error::InvalidOptions(
                "the root path (chroot + base) is empty: names would be top-level nodes, \
                 and `zookeeper/…` ZooKeeper's own subtree; give a base such as /distlock"
                    .into(),
            ));
        }
        // The client takes a chroot from the hosts string too
        // (`host:port/chroot`): the nodes land under chroot + root.
        let chroot = self
            .hosts
            .find('/')
            .map_or("", |i| self.hosts[i..].trim_end_matches('/'));
        let full = format!("{chroot}{}", self.root);
        if full == "/zookeeper" || full.starts_with("/zookeeper/") {
            return Err(Error::InvalidOptions(if chroot.is_empty() {
                format!("root path {full:?} is in ZooKeeper's own /zookeeper subtree")
            } else {
                format!(
                    "root path {full:?} (the chroot {chroot:?} in the hosts, then the root {:?}) \
                     is in ZooKeeper's own /zookeeper subtree",
                    self.root
                )
            }));
        }
        {
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
        if let Some(label) = &self.owner_label {
            distlock_core::inspect::check_label(label)?;
        }
        let user = self
            .digest
            .as_deref()
            .map(|d| d.split_once(':').map(|(u, _)| u));
        if user.is_some_and(|user| user.is_none_or(str::is_empty)) {
            return Err(Error::InvalidOptions(
                "digest credentials must be user:password, with a user".into(),
            ));
        }
        Ok(())
    }
}

/// Shows the digest user, never its password, and whether TLS is set.
impl fmt::Debug for ZkOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = self.digest.as_deref().map(|d| match d.split_once(':') {
            Some((user, _)) => format!("{user}:***"),
            None => "***".to_owned(),
        });
        let mut s = f.debug_struct("ZkOptions");
        s.field("hosts", &self.hosts)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("digest", &digest)
            .field("owner_label", &self.owner_label);
        #[cfg(feature = "tls")]
        s.field("tls", &self.tls.as_ref().map(|_| "<set>"));
        s.finish()
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
        let o = ZkOptions::from_url("zk://127.0.0.1:2181/app/?base=/locks/").unwrap();
        assert_eq!(o.root, "/app/locks");
    }

    #[test]
    fn a_root_at_the_top_or_in_the_system_subtree_and_an_empty_user_are_refused() {
        for (url, says) in [
            ("zk://127.0.0.1:2181/?base=", "\"base\" is empty"),
            ("zk://127.0.0.1:2181?base=", "\"base\" is empty"),
            ("zk://127.0.0.1:2181/app?base=/", "\"base\" is empty"),
            ("zk://127.0.0.1:2181/app?base=locks", "must begin with '/'"),
            ("zk://:s3cret@127.0.0.1:2181", "digest user is empty"),
            ("zk://:@127.0.0.1:2181", "digest user is empty"),
        ] {
            let e = ZkOptions::from_url(url).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            assert!(e.to_string().contains(says), "{url}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{url}: {e}");
        }
        for url in [
            "zk://127.0.0.1:2181/zookeeper",
            "zk://127.0.0.1:2181/zookeeper/",
            "zk://127.0.0.1:2181?base=/zookeeper",
            "zk://127.0.0.1:2181/zookeeper?base=/x",
            "zk://127.0.0.1:2181/?base=/zookeeper/quota",
        ] {
            let e = ZkOptions::from_url(url).unwrap_err();
            assert!(matches!(e, Error::InvalidOptions(_)), "{url}: {e:?}");
            assert!(e.to_string().contains("/zookeeper subtree"), "{url}: {e}");
        }
        // Near misses are paths of their own.
        for (url, root) in [
            ("zk://127.0.0.1:2181/zookeeper2", "/zookeeper2/distlock"),
            (
                "zk://127.0.0.1:2181/app/zookeeper",
                "/app/zookeeper/distlock",
            ),
            ("zk://127.0.0.1:2181/app?base=/zookeeper", "/app/zookeeper"),
        ] {
            assert_eq!(ZkOptions::from_url(url).unwrap().root, root, "{url}");
        }
        // The same rules for options made in code.
        for options in [
            ZkOptions::new("h:1").root(""),
            ZkOptions::new("h:1").root("/"),
            ZkOptions::new("h:1").root("/zookeeper/x"),
            ZkOptions::new("h:1").digest("", "pw"),
        ] {
            let e = options.validate().unwrap_err();
            assert!(matches!(e, Error::InvalidOptions(_)), "{e:?}");
        }
        assert!(ZkOptions::new("h:1").digest("u", "").validate().is_ok());
        // A chroot in the hosts string (which the client honours) counts.
        for hosts in [
            "h:1/zookeeper",
            "h:1/zookeeper/",
            "h:1,h:2/zookeeper/quota",
            "h:1/zookeeper/x/y",
        ] {
            let e = ZkOptions::new(hosts).validate().unwrap_err();
            assert!(matches!(e, Error::InvalidOptions(_)), "{hosts}: {e:?}");
            assert!(e.to_string().contains("/zookeeper subtree"), "{hosts}: {e}");
        }
        let e = ZkOptions::new("h:1/").root("/zookeeper").validate();
        assert!(matches!(e, Err(Error::InvalidOptions(_))), "{e:?}");
        for hosts in ["h:1/zookeeper2", "h:1/app/zookeeper", "h:1/app"] {
            assert!(ZkOptions::new(hosts).validate().is_ok(), "{hosts}");
        }
        assert!(ZkOptions::new("h:1/app")
            .root("/zookeeper")
            .validate()
            .is_ok());
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
            "zk://u:pw@h:1/x?base=/a b",
        ] {
            assert!(
                matches!(ZkOptions::from_url(bad), Err(Error::InvalidOptions(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn known_keys_parse_and_unknown_or_repeated_ones_do_not() {
        let o = ZkOptions::from_url(
            "zk://h:1?connect_timeout_ms=700&operation_timeout_ms=800&session_timeout_ms=900&base=/b/",
        )
        .unwrap();
        assert_eq!(o.connect_timeout, Duration::from_millis(700));
        assert_eq!(o.operation_timeout, Duration::from_millis(800));
        assert_eq!(o.session_timeout, Duration::from_millis(900));
        assert_eq!(o.root, "/b");
        for (url, says) in [
            ("zk://u:s3cret@h:1?nope=1", "unknown option \"nope\" (known: session_timeout_ms, connect_timeout_ms, operation_timeout_ms, base, owner)"),
            ("zk://u:s3cret@h:1?prefix=a", "unknown option \"prefix\""),
            ("zk://u:s3cret@h:1?base=/a&base=/b", "given twice"),
            ("zk://u:s3cret@h:1?session_timeout_ms=x", "not a whole number of milliseconds"),
            ("zk://u:s3cret@h:1?connect_timeout_ms=-1", "not a whole number of milliseconds"),
        ] {
            let e = ZkOptions::from_url(url).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn the_digest_password_never_shows() {
        let mut parsed = 0;
        for password in ["s3cr3t:p@ss/w?rd", "s3cr3t:p@ss/w", "s3cr3t"] {
            for url in [
                format!("zk://alice:{password}@127.0.0.1:2181/app"),
                format!("zk://alice:{password}@"),
                format!("zk://alice:{password}@host"),
                format!("zk://alice:{password}@h:1?nope=1"),
                format!("zk://alice:{password}@h:1?session_timeout_ms=x"),
                format!("zk://alice:{password}@h:1?session_timeout_ms=0"),
                format!("zk://alice:{password}@h:1/a b"),
                format!("zookeeper://alice:{password}@:2181"),
                format!("zk:/alice:{password}@h:1"),
                format!("alice:{password}@h:1"),
            ] {
                match ZkOptions::from_url(&url) {
                    Ok(o) => {
                        parsed += 1;
                        assert_eq!(o.digest.as_deref(), Some(&*format!("alice:{password}")));
                        let shown = format!("{o:?} {o:#?}");
                        assert!(!shown.contains("s3cr3t"), "{shown}");
                        assert!(shown.contains("alice:***"), "{shown}");
                    }
                    Err(e) => {
                        assert!(e.is_invalid_input(), "{url}: {e:?}");
                        assert!(!e.to_string().contains("s3cr3t"), "{url}: {e}");
                        assert!(!format!("{e:?}").contains("s3cr3t"), "{url}: {e:?}");
                    }
                }
            }
        }
        assert_eq!(parsed, 2, "the well-formed URLs parse");
        let o = ZkOptions::new("h:1").digest("bob", "hunter2");
        let shown = format!("{o:?}");
        assert!(
            shown.contains("bob:***") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(!format!("{:?}", ZkOptions::new("h:1")).contains("***"));
    }
}
