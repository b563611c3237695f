//! A connect URL, read in one place: what each scheme names (one server, a
//! Cluster's seed nodes, the Sentinels of a master, Redlock's masters) and
//! the options of its query.

use distlock_core::backend::url::invalid_url;
use distlock_core::Result;

use crate::net::sentinel::{sentinel_addr, SentinelAuth};
use crate::options::{RedisOptions, CLIENT_KEYS_TCP};

/// What a connect URL names, with the options of its query (which
/// override the options it was read with).
pub(crate) enum Target {
    /// One server, or the master its Sentinels name.
    Server(Server),
    /// `redis+cluster://`: a Redis Cluster's seed nodes, each a `redis://`
    /// URL.
    #[cfg(feature = "cluster")]
    Cluster {
        nodes: Vec<String>,
        options: RedisOptions,
    },
    /// `redis+redlock://`: Redlock's independent masters, each a
    /// `redis://` URL.
    Redlock {
        masters: Vec<String>,
        options: RedisOptions,
    },
}

/// What [`RedisProvider::connect_with`](crate::RedisProvider::connect_with)
/// connects to.
pub(crate) enum Server {
    /// `redis://`, `rediss://`, `redis+unix://`…: the URL for the client
    /// (without distlock's query keys).
    Single { url: String, options: RedisOptions },
    /// `redis+sentinel://`: the master its Sentinels name.
    Sentinel(SentinelUrl),
}

impl Target {
    /// Reads `url`, whatever its scheme (case-insensitive).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) /
    /// [`Error::InvalidOptions`](distlock_core::Error::InvalidOptions) for a
    /// bad URL or option;
    /// [`Error::UnsupportedBackend`](distlock_core::Error::UnsupportedBackend)
    /// for a cluster URL without the `cluster` feature.
    pub(crate) fn parse(url: &str, options: RedisOptions) -> Result<Target> {
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default();
        match scheme.as_str() {
            "redis+cluster" => cluster_url(&url[scheme.len() + 3..], options),
            "redis+redlock" => redlock_url(url, options)
                .map(|(masters, options)| Target::Redlock { masters, options }),
            _ => Server::parse(url, options).map(Target::Server),
        }
    }
}

impl Server {
    /// Reads a `redis+sentinel://` URL, or any other as one server's.
    ///
    /// # Errors
    ///
    /// As [`Target::parse`].
    pub(crate) fn parse(url: &str, options: RedisOptions) -> Result<Server> {
        if url
            .get(..17)
            .is_some_and(|s| s.eq_ignore_ascii_case("redis+sentinel://"))
        {
            return sentinel_url(url, options).map(Server::Sentinel);
        }
        check_tcp_url(url)?;
        let (url, options) = options.from_url(url)?;
        Ok(Server::Single { url, options })
    }
}

/// Says which part of a one-server TCP URL (`redis://`, `rediss://`,
/// `valkey://`, `valkeys://`) is wrong: the host, the port or the database
/// (the path). The client's own verdict, "Redis URL did not parse", names
/// none. Other schemes are left to the client.
fn check_tcp_url(url: &str) -> Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(());
    };
    if !matches!(
        scheme.to_ascii_lowercase().as_str(),
        "redis" | "rediss" | "valkey" | "valkeys"
    ) {
        return Ok(());
    }
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, tail)) => (host, Some(tail.strip_prefix(':').unwrap_or(tail))),
            None => return Err(invalid_url(url, "the IPv6 host has no closing ']'")),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(invalid_url(url, "no host (redis://HOST:PORT/DB)"));
    }
    if let Some(port) = port {
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(invalid_url(
                url,
                format_args!("port {port:?} is not a number from 1 to 65535"),
            ));
        }
    }
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(invalid_url(
            url,
            format_args!("database {db:?} (the URL's path) is not a number"),
        ));
    }
    Ok(())
}

/// Splits `redis+cluster://[user:password@]host:port,host:port[?options]`
/// (`rest` is what follows the scheme) into one `redis://` URL per seed
/// node and the options of its query.
#[cfg(feature = "cluster")]
fn cluster_url(rest: &str, options: RedisOptions) -> Result<Target> {
    // The whole URL, for error messages (redacted there).
    let url = format!("redis+cluster://{rest}");
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (auth, hosts) = match hosts.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), hosts),
    };
    let hosts = hosts.trim_end_matches('/');
    // The seed nodes are `redis://` URLs: the keys the client reads from
    // those go to every node, so all agree (redis-rs requires it).
    let (options, client) = options.apply_query(&url, query, CLIENT_KEYS_TCP)?;
    let client_query = if client.is_empty() {
        String::new()
    } else {
        format!("?{}", client.join("&"))
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{client_query}"))
        .collect();
    if nodes.is_empty() {
        return Err(invalid_url(
            &url,
            "names no seed node (host:port[,host:port…])",
        ));
    }
    Ok(Target::Cluster { nodes, options })
}

#[cfg(not(feature = "cluster"))]
fn cluster_url(_rest: &str, _options: RedisOptions) -> Result<Target> {
    Err(distlock_core::Error::UnsupportedBackend(
        "redis+cluster:// needs the `cluster` feature of distlock-redis".into(),
    ))
}

/// The userinfo of a `redis+sentinel://` URL, percent-decoded.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
        {
            let hex = |b: u8| (b as char).to_digit(16).unwrap_or(0);
            #[allow(clippy::cast_possible_truncation)]
            out.push((hex(bytes[i + 1]) * 16 + hex(bytes[i + 2])) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with the value of `sentinel_password=` hidden, for messages.
fn hide_sentinel_password(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("sentinel_password", _)) => "sentinel_password=***".to_owned(),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

/// The query keys a `redis+sentinel://` URL takes besides the options.
const SENTINEL_KEYS: &[&str] = &["sentinel_user", "sentinel_password", "db"];

/// What a `redis+sentinel://` URL says.
#[derive(Debug)]
pub(crate) struct SentinelUrl {
    pub(crate) sentinels: Vec<String>,
    pub(crate) master_name: String,
    pub(crate) auth: SentinelAuth,
    pub(crate) options: RedisOptions,
}

/// Parses `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[?query]`.
pub(crate) fn sentinel_url(url: &str, options: RedisOptions) -> Result<SentinelUrl> {
    let shown = hide_sentinel_password(url);
    let rest = url
        .get(..17)
        .filter(|s| s.eq_ignore_ascii_case("redis+sentinel://"))
        .map(|_| &url[17..])
        .ok_or_else(|| invalid_url(&shown, "is not a redis+sentinel:// URL"))?;
    if rest.contains('#') {
        return Err(invalid_url(
            &shown,
            "has a #fragment, which redis+sentinel:// does not read",
        ));
    }
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, main) = match main.rsplit_once('@') {
        Some((userinfo, main)) => (Some(userinfo), main),
        None => (None, main),
    };
    let (hosts, master_name) = main.split_once('/').unwrap_or((main, ""));
    let master_name = decode(master_name.trim_end_matches('/'));
    let sentinels: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if sentinels.is_empty() {
        return Err(invalid_url(
            &shown,
            "names no Sentinel (host:port[,host:port…]/master-name)",
        ));
    }
    if master_name.is_empty() {
        return Err(invalid_url(
            &shown,
            "names no master (host:port[,host:port…]/master-name)",
        ));
    }
    if master_name.contains('/') {
        return Err(invalid_url(
            &shown,
            "has a path after the master name (the database is the query key `db`)",
        ));
    }
    for s in &sentinels {
        sentinel_addr(s).map_err(|why| invalid_url(&shown, why))?;
    }
    let (options, extra) = options.apply_query(&shown, query, SENTINEL_KEYS)?;
    let mut auth = SentinelAuth::new();
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        let user = (!user.is_empty()).then(|| decode(user));
        if !password.is_empty() {
            auth = auth.master(user.as_deref(), &decode(password));
        } else if user.is_some() {
            return Err(invalid_url(
                &shown,
                "has a user but no password (user:password@)",
            ));
        }
    }
    let mut sentinel_user = None;
    let mut sentinel_password = None;
    for pair in extra {
        let (key, value) = pair.split_once('=').unwrap_or((&pair, ""));
        match key {
            "sentinel_user" => sentinel_user = Some(decode(value)),
            "sentinel_password" => sentinel_password = Some(decode(value)),
            "db" => {
                auth = auth.db(value.parse().ok().filter(|db| *db >= 0).ok_or_else(|| {
                    invalid_url(
                        &shown,
                        format_args!("db={value:?} is not a database number"),
                    )
                })?);
            }
            _ => {}
        }
    }
    match (sentinel_user, sentinel_password) {
        (user, Some(password)) => auth = auth.sentinels(user.as_deref(), &password),
        (Some(_), None) => {
            return Err(invalid_url(&shown, "sentinel_user needs sentinel_password"))
        }
        (None, None) => {}
    }
    Ok(SentinelUrl {
        sentinels,
        master_name,
        auth,
        options,
    })
}

const SCHEME: &str = "redis+redlock://";

/// Splits `redis+redlock://…` into one `redis://` URL per master and the
/// options of its query.
pub(crate) fn redlock_url(url: &str, options: RedisOptions) -> Result<(Vec<String>, RedisOptions)> {
    let rest = url
        .get(..SCHEME.len())
        .filter(|s| s.eq_ignore_ascii_case(SCHEME))
        .map(|_| &url[SCHEME.len()..])
        .ok_or_else(|| invalid_url(url, format_args!("does not start with {SCHEME}")))?;
    if rest.contains('#') {
        return Err(invalid_url(url, "takes no #fragment"));
    }
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (options, client) = options.apply_query(url, query, CLIENT_KEYS_TCP)?;
    let client_query = if client.is_empty() {
        String::new()
    } else {
        format!("?{}", client.join("&"))
    };
    // `/db` after the last host applies to all.
    let (hosts, db) = match hosts.rfind('/') {
        Some(i) if !hosts[i..].contains('@') && !hosts[i..].contains(',') => {
            (&hosts[..i], &hosts[i..])
        }
        _ => (hosts, ""),
    };
    let mut auth = "";
    let mut urls = Vec::new();
    for (i, item) in hosts.split(',').enumerate() {
        let (own, host) = match item.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, item),
        };
        if i == 0 {
            auth = own.unwrap_or("");
        }
        if host.is_empty() {
            return Err(invalid_url(
                url,
                "names an empty host (host:port[,host:port…])",
            ));
        }
        let auth = own.unwrap_or(auth);
        let at = if auth.is_empty() { "" } else { "@" };
        urls.push(format!("redis://{auth}{at}{host}{db}{client_query}"));
    }
    Ok((urls, options))
}

#[cfg(test)]
mod sentinel_url_tests {
    use std::time::Duration;

    use distlock_core::Error;

    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive() {
        let u = sentinel_url("REDIS+Sentinel://h:1/m", RedisOptions::new()).unwrap();
        assert_eq!(u.master_name, "m");
    }

    #[test]
    fn urls_name_sentinels_master_credentials_and_options() {
        let u = sentinel_url(
            "redis+sentinel://u:p%40ss@127.0.0.1:26379,h2:26380/mymaster?prefix=app:&sentinel_password=sp&db=3&lease_ttl_ms=900",
            RedisOptions::new(),
        )
        .unwrap();
        assert_eq!(u.sentinels, ["127.0.0.1:26379", "h2:26380"]);
        assert_eq!(u.master_name, "mymaster");
        assert_eq!(
            u.auth,
            SentinelAuth::new()
                .master(Some("u"), "p@ss")
                .sentinels(None, "sp")
                .db(3)
        );
        assert_eq!(u.options.prefix, "app:");
        assert_eq!(u.options.lease.ttl(), Duration::from_millis(900));
        let shown = format!("{:?}", u.auth);
        assert!(
            !shown.contains("p@ss") && !shown.contains("sp\""),
            "{shown}"
        );
        let u = sentinel_url("redis+sentinel://h:1/m/", RedisOptions::new()).unwrap();
        assert_eq!((u.sentinels.len(), u.master_name.as_str()), (1, "m"));
        assert_eq!(u.auth, SentinelAuth::new());
    }

    #[test]
    fn bad_urls_are_refused_with_secrets_hidden() {
        for (url, says) in [
            ("redis+sentinel://u:s3cret@h:1/m#x", "#fragment"),
            ("redis+sentinel://u:s3cret@h:1", "names no master"),
            ("redis+sentinel://u:s3cret@h:1/", "names no master"),
            ("redis+sentinel://u:s3cret@/m", "names no Sentinel"),
            ("redis+sentinel://u:s3cret@,/m", "names no Sentinel"),
            ("redis+sentinel://u:s3cret@h:x/m", "no valid port"),
            ("redis+sentinel://u:s3cret@h:0/m", "no valid port"),
            ("redis+sentinel://u:s3cret@h:70000/m", "no valid port"),
            ("redis+sentinel://u:s3cret@h/m", "not host:port"),
            ("redis+sentinel://u:s3cret@h:1/m/2", "path after the master"),
            (
                "redis+sentinel://u:s3cret@h:1/m?nope=1",
                "unknown option \"nope\"",
            ),
            (
                "redis+sentinel://u:s3cret@h:1/m?protocol=3",
                "unknown option",
            ),
            (
                "redis+sentinel://h:1/m?sentinel_password=s3cret&sentinel_password=s3cret",
                "given twice",
            ),
            (
                "redis+sentinel://h:1/m?sentinel_password=s3cret&db=x",
                "db=\"x\"",
            ),
            (
                "redis+sentinel://h:1/m?sentinel_user=a",
                "needs sentinel_password",
            ),
            (
                "redis+sentinel://h:1/m?recheck_ms=soon&sentinel_password=s3cret",
                "milliseconds",
            ),
        ] {
            let e = sentinel_url(url, RedisOptions::new()).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }
}

#[cfg(test)]
mod redlock_url_tests {
    use std::time::Duration;

    use distlock_core::Error;

    use super::*;

    #[test]
    fn urls_split_per_master_with_shared_credentials_db_and_client_keys() {
        let (urls, o) = redlock_url(
            "redis+redlock://u:pw@h1:1,h2:2,v:x@h3:3/2?prefix=app:&protocol=resp3&recheck_ms=50",
            RedisOptions::new(),
        )
        .unwrap();
        assert_eq!(
            urls,
            [
                "redis://u:pw@h1:1/2?protocol=resp3",
                "redis://u:pw@h2:2/2?protocol=resp3",
                "redis://v:x@h3:3/2?protocol=resp3",
            ]
        );
        assert_eq!(o.prefix, "app:");
        assert_eq!(o.recheck_interval, Duration::from_millis(50));
        let (urls, _) = redlock_url("redis+redlock://h1:1", RedisOptions::new()).unwrap();
        assert_eq!(urls, ["redis://h1:1"]);
    }

    #[test]
    fn bad_urls_are_invalid_url_with_the_password_hidden() {
        for (url, says) in [
            ("redis+redlock://u:s3cret@", "empty host"),
            ("redis+redlock://u:s3cret@h1:1,,h2:2", "empty host"),
            ("redis+redlock://u:s3cret@h1:1?nope=1", "unknown option"),
            ("redis+redlock://u:s3cret@h1:1?prefix=a&prefix=b", "twice"),
            ("redis+redlock://u:s3cret@h1:1#x", "fragment"),
            ("redis://u:s3cret@h1:1", "does not start with"),
        ] {
            let e = redlock_url(url, RedisOptions::new()).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl(_)), "{url}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }

    #[test]
    fn a_bad_part_of_a_server_url_is_named() {
        for (url, says) in [
            ("redis://127.0.0.1:notaport", "port \"notaport\""),
            ("redis://127.0.0.1:99999", "port \"99999\""),
            ("redis://127.0.0.1:0", "port \"0\""),
            ("rediss://u:s3cret@h:x/0", "port \"x\""),
            ("redis://:s3cret@/", "no host"),
            ("redis://", "no host"),
            ("redis://h:6379/notadb", "database \"notadb\""),
            ("valkey://[::1/0", "closing ']'"),
        ] {
            let Err(e) = Server::parse(url, RedisOptions::new()) else {
                panic!("{url} was accepted");
            };
            assert!(
                matches!(e, distlock_core::Error::InvalidUrl(_)),
                "{url}: {e:?}"
            );
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
        for good in [
            "redis://h",
            "redis://h:6379",
            "redis://u:p@h:6379/3?protocol=resp3",
            "redis://[::1]:6379/0",
            "rediss://h/",
            "redis+unix:///tmp/r.sock?db=1",
        ] {
            Server::parse(good, RedisOptions::new()).unwrap();
        }
    }
}
