//! The test-support servers and proxy work: each starts, answers, and can be
//! killed, paused and restarted; the proxy forwards, delays, blackholes and
//! cuts, and loses the reply to a request that reached the server.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use test_support::zookeeper::ZkMode;
use test_support::{Proxy, RedisServer, ZkCluster};

fn roundtrip(addr: SocketAddr, request: &[u8], expect: usize) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(request)?;
    let mut out = vec![0u8; expect];
    s.read_exact(&mut out)?;
    Ok(out)
}

#[test]
fn redis_starts_pauses_restarts() {
    let mut redis = RedisServer::start();
    assert!(redis.addr().ip().is_loopback());
    assert_eq!(redis.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cli(&["GET", "k"]), "v");

    redis.pause();
    let r = roundtrip(redis.addr(), b"PING\r\n", 7);
    assert!(r.is_err(), "a paused server answered");
    redis.resume();
    assert_eq!(
        roundtrip(redis.addr(), b"PING\r\n", 7).unwrap(),
        b"+PONG\r\n"
    );

    redis.kill();
    assert!(!redis.is_running());
    assert!(
        TcpStream::connect(redis.addr()).is_err(),
        "killed server accepts"
    );
    redis.restart();
    assert!(redis.is_running());
    // No persistence: the restart lost the data.
    assert_eq!(redis.cli(&["GET", "k"]), "");
}

#[test]
fn zookeeper_standalone_serves_and_stops() {
    let mut zk = ZkCluster::standalone();
    assert_eq!(zk.len(), 1);
    assert_eq!(zk.mode(0), Some(ZkMode::Standalone));
    let addr = zk.addr(0);
    assert!(addr.ip().is_loopback());
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", addr.port()));
    zk.kill(0);
    assert!(TcpStream::connect(addr).is_err(), "killed server accepts");
    zk.restart(0);
    assert_eq!(zk.mode(0), Some(ZkMode::Standalone));
    drop(zk);
    assert!(
        TcpStream::connect(addr).is_err(),
        "server outlived its handle"
    );
}

#[test]
fn zookeeper_ensemble_elects_and_survives_leader_kill() {
    let mut zk = ZkCluster::start(3);
    let modes: Vec<_> = (0..3).map(|i| zk.mode(i)).collect();
    assert_eq!(
        modes.iter().filter(|m| **m == Some(ZkMode::Leader)).count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes
            .iter()
            .filter(|m| **m == Some(ZkMode::Follower))
            .count(),
        2,
        "{modes:?}"
    );
    let leader = zk.leader().expect("a leader");
    zk.kill(leader);
    let start = Instant::now();
    let new_leader = loop {
        if let Some(l) = zk.leader() {
            break l;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no new leader");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(new_leader, leader);
    zk.restart(leader);
    assert!(matches!(
        zk.mode(leader),
        Some(ZkMode::Follower | ZkMode::Leader)
    ));
}

#[test]
fn proxy_forwards_delays_blackholes_and_cuts() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.addr());
    assert!(proxy.addr().ip().is_loopback());
    assert_eq!(
        roundtrip(proxy.addr(), b"PING\r\n", 7).unwrap(),
        b"+PONG\r\n"
    );

    proxy.set_delay(Duration::from_millis(150));
    let start = Instant::now();
    assert_eq!(
        roundtrip(proxy.addr(), b"PING\r\n", 7).unwrap(),
        b"+PONG\r\n"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "no delay added"
    );
    proxy.set_delay(Duration::ZERO);

    proxy.set_blackhole(true);
    assert!(
        roundtrip(proxy.addr(), b"PING\r\n", 7).is_err(),
        "blackhole answered"
    );
    proxy.set_blackhole(false);

    // A connection that works, then is cut: the client sees EOF or reset.
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    conn.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 7];
    conn.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
    let start = Instant::now();
    while proxy.open_connections() == 0 {
        assert!(start.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.cut();
    let mut rest = Vec::new();
    let r = conn.read_to_end(&mut rest);
    assert!(
        r.is_err() || rest.is_empty(),
        "cut connection still delivers"
    );
    // New connections are still accepted after a cut.
    assert_eq!(
        roundtrip(proxy.addr(), b"PING\r\n", 7).unwrap(),
        b"+PONG\r\n"
    );
}

#[test]
fn proxy_loses_the_reply_to_a_request_that_lands() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.addr());
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    conn.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    conn.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");

    proxy.lose_next_reply();
    assert!(!proxy.losing_replies(), "armed, but nothing forwarded yet");
    conn.write_all(b"SET k v\r\n").unwrap();
    let mut reply = [0u8; 5];
    let r = conn.read_exact(&mut reply);
    assert!(r.is_err(), "the reply came through: {reply:?}");
    assert!(proxy.losing_replies());
    // The request landed: the server has the value.
    assert_eq!(redis.cli(&["GET", "k"]), "v");
    let start = Instant::now();
    while proxy.swallowed_bytes() < 5 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "+OK not swallowed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Other connections get no replies either, until a cut.
    assert!(roundtrip(proxy.addr(), b"PING\r\n", 7).is_err());
    proxy.cut();
    assert!(!proxy.losing_replies());
    assert_eq!(
        roundtrip(proxy.addr(), b"GET k\r\n", 7).unwrap(),
        b"$1\r\nv\r\n"
    );

    // heal() ends it too, without closing the connection.
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    proxy.lose_next_reply();
    conn.write_all(b"SET k w\r\n").unwrap();
    assert!(conn.read_exact(&mut reply).is_err(), "reply came through");
    assert_eq!(redis.cli(&["GET", "k"]), "w");
    proxy.heal();
    conn.write_all(b"PING\r\n").unwrap();
    conn.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
}

#[test]
#[should_panic(expected = "loopback")]
fn proxy_refuses_non_loopback_targets() {
    let _ = Proxy::start(SocketAddr::from(([0, 0, 0, 0], 6379)));
}
