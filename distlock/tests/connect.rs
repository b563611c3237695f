//! `distlock::connect` dispatches on the URL's scheme with typed errors.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use distlock::{Error, Scheme};

#[tokio::test]
async fn mem_urls_share_tables_by_name() {
    let a = distlock::connect("mem://connect-test").await.unwrap();
    let b = distlock::connect("mem://connect-test/").await.unwrap();
    let other = distlock::connect("mem://connect-other").await.unwrap();
    assert_eq!(a.backend(), "mem");
    let g = a.mutex("x").unwrap().lock().await.unwrap();
    assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_none());
    assert!(other
        .mutex("x")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_some());
    g.release().await.unwrap();
}

#[tokio::test]
async fn bad_urls_are_typed_errors() {
    assert!(matches!(
        distlock::connect("localhost:6379").await,
        Err(Error::InvalidUrl(_))
    ));
    assert!(matches!(
        distlock::connect("").await,
        Err(Error::InvalidUrl(_))
    ));
    for unknown in ["ftp://x", "etcd://127.0.0.1:2379", "://x"] {
        assert!(matches!(
            distlock::connect(unknown).await,
            Err(Error::UnsupportedBackend(_))
        ));
    }
}

#[test]
fn schemes() {
    assert_eq!(Scheme::of("mem://").unwrap(), Scheme::Mem);
    assert_eq!(Scheme::of("REDIS://h:1").unwrap(), Scheme::Redis);
    assert_eq!(Scheme::of("rediss://h:1").unwrap(), Scheme::Redis);
    assert_eq!(
        Scheme::of("redis+sentinel://h:1,h:2/mymaster").unwrap(),
        Scheme::Redis
    );
    assert_eq!(
        Scheme::of("redis+redlock://h:1,h:2,h:3").unwrap(),
        Scheme::Redis
    );
    assert_eq!(Scheme::of("zk://h:1,h:2/app").unwrap(), Scheme::ZooKeeper);
}

#[tokio::test]
async fn redis_urls_reach_the_redis_backend_when_its_feature_is_on() {
    let redis = test_support::redis::shared();
    let r = distlock::connect(&redis.url()).await;
    if cfg!(feature = "redis") {
        let locks = r.unwrap();
        assert_eq!(locks.backend(), "redis");
        let name = test_support::unique_name("facade");
        let g = locks.mutex(&name).unwrap().lock().await.unwrap();
        assert!(g.fencing_token() >= 1);
        g.release().await.unwrap();
    } else {
        assert!(matches!(r, Err(Error::UnsupportedBackend(_))));
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_and_sentinel_urls_reach_the_redis_backend() {
    let masters = test_support::masters::RedisMasters::start(3);
    // Schemes are case-insensitive.
    let url = masters.url().replacen("redis+redlock", "Redis+Redlock", 1);
    let locks = distlock::connect(&url).await.unwrap();
    assert_eq!(locks.backend(), "redis+redlock");
    let name = test_support::unique_name("facade-redlock");
    let g = locks.mutex(&name).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    let group = test_support::sentinel::SentinelGroup::start(0);
    let locks = distlock::connect(&group.url()).await.unwrap();
    assert_eq!(locks.backend(), "redis");
    let g = locks.mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(group.master().cli(&["EXISTS", &name]), "1");
    g.release().await.unwrap();
}

#[tokio::test]
async fn zookeeper_urls_reach_the_zookeeper_backend_when_its_feature_is_on() {
    let zk = test_support::zookeeper::shared();
    let r = distlock::connect(&format!("zk://{}/facade", zk.connect_string())).await;
    if cfg!(feature = "zookeeper") {
        let locks = r.unwrap();
        assert_eq!(locks.backend(), "zookeeper");
        let name = test_support::unique_name("facade");
        let g = locks.fair_mutex(&name).unwrap().lock().await.unwrap();
        assert!(g.fencing_token() >= 1);
        g.release().await.unwrap();
    } else {
        assert!(matches!(r, Err(Error::UnsupportedBackend(_))));
    }
}
