//! `rediss://` against a real redis-server with TLS, trusting a test CA.
#![cfg(feature = "tls")]
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use distlock_core::Provider;
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::tls::TestCa;
use test_support::{free_port, unique_name, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_trusted_ca_and_refused_without_it() {
    let ca = TestCa::generate();
    let tls_port = free_port();
    let cert = ca.server_cert().display().to_string();
    let key = ca.server_key().display().to_string();
    let ca_cert = ca.ca_cert().display().to_string();
    let _redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca_cert,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let pem = std::fs::read(ca.ca_cert()).unwrap();
    for options in [RedisOptions::new(), RedisOptions::new().pool_size(2)] {
        let locks = RedisProvider::connect_with(&url, options.tls_root_cert(pem.clone()))
            .await
            .unwrap();
        let g = locks
            .mutex(&unique_name("tls"))
            .unwrap()
            .lock()
            .await
            .unwrap();
        assert!(g.fencing_token() >= 1);
        g.release().await.unwrap();
    }
    // Without the CA the server's certificate is not trusted: a typed error.
    let r = RedisProvider::connect(&url).await;
    let e = r.expect_err("connected to an untrusted server");
    assert!(!e.is_invalid_input(), "{e:?}");
}
