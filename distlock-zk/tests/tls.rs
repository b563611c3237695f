//! TLS to a real ZooKeeper serving a test CA's certificate (feature `tls`).
#![cfg(feature = "tls")]
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use distlock_core::Provider;
use distlock_zk::{TlsOptions, ZkOptions, ZkProvider};
use test_support::tls::TestCa;
use test_support::{unique_name, ZkCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_trusted_ca_and_refused_without_it() {
    let ca = TestCa::generate();
    let (_zk, port) = ZkCluster::standalone_tls(&ca);
    distlock_zk::install_crypto_provider();
    let pem = std::fs::read_to_string(ca.ca_cert()).unwrap();
    let tls = TlsOptions::new().with_pem_ca(&pem).unwrap();
    let hosts = format!("127.0.0.1:{port}");
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts).tls(tls))
        .await
        .unwrap();
    let g = locks
        .fair_mutex(&unique_name("tls"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert!(g.fencing_token() >= 1);
    g.release().await.unwrap();
    // Without the CA the server's certificate is not trusted.
    let untrusted = ZkOptions::new(&hosts)
        .tls(TlsOptions::new())
        .connect_timeout(std::time::Duration::from_secs(2));
    let e = ZkProvider::connect_with(untrusted).await.unwrap_err();
    assert!(!e.is_invalid_input(), "{e:?}");
}
