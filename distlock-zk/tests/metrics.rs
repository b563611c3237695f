//! The metrics a ZooKeeper provider records match the operations performed
//! (a test binary of its own: the recorder is global).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use distlock_core::Provider;
use distlock_zk::ZkProvider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_are_recorded() {
    let url = format!(
        "zk://{}/metrics",
        test_support::zookeeper::shared().connect_string()
    );
    let a = ZkProvider::connect(&url).await.unwrap();
    let b = ZkProvider::connect(&url).await.unwrap();
    let lease = a.default_lease();
    test_support::metrics::acquisitions_are_recorded(&a, &b, "zookeeper", lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_events_carry_the_owner() {
    let url = format!(
        "zk://{}/traced?owner=traced-job",
        test_support::zookeeper::shared().connect_string()
    );
    let provider = ZkProvider::connect(&url).await.unwrap();
    assert!(provider.owner().starts_with("traced-job@"));
    test_support::metrics::tracing_events_carry_the_owner(&provider, |_| async { None }).await;
}
