//! Interop with Apache Curator 5.4 (Debian's `libcurator-recipes-java`): a
//! distlock fair mutex and a Curator `InterProcessMutex` on the same path
//! exclude each other both ways, and Curator's `DistributedAtomicLong` reads
//! a distlock id counter.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use distlock_core::Provider;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::unique_name;

const JARS: &[&str] = &[
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/curator-recipes.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/guava.jar",
    "/usr/share/java/slf4j-api.jar",
    "/usr/share/java/slf4j-simple.jar",
];

/// Compiles the Java peer once per test binary; returns its class path.
fn classpath() -> &'static str {
    static CLASSPATH: OnceLock<String> = OnceLock::new();
    CLASSPATH.get_or_init(|| {
        for jar in JARS {
            assert!(
                std::path::Path::new(jar).is_file(),
                "{jar} is missing: run scripts/install-servers.sh (installs libcurator-recipes-java)"
            );
        }
        let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("curator-peer");
        std::fs::create_dir_all(&out_dir).unwrap();
        let jars = JARS.join(":");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/CuratorPeer.java");
        let status = Command::new("javac")
            .args(["-cp", &jars, "-d"])
            .arg(&out_dir)
            .arg(source)
            .status()
            .expect("javac runs (a JDK is installed by scripts/install-servers.sh)");
        assert!(status.success(), "javac failed");
        format!("{}:{jars}", out_dir.display())
    })
}

fn curator(hosts: &str, path: &str, args: &[&str]) -> Child {
    Command::new("java")
        .args([
            "-cp",
            classpath(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "CuratorPeer",
        ])
        .args([hosts, path])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("java runs")
}

fn output(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "Curator peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn run(hosts: &str, path: &str, args: &[&str]) -> String {
    let (hosts, path) = (hosts.to_owned(), path.to_owned());
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        output(curator(&hosts, &path, &args))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_curator_mutexes_exclude_each_other() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("curator");
    let path = locks.path(&name).unwrap();
    let lock = locks.fair_mutex(&name).unwrap();

    let guard = lock.lock().await.unwrap();
    assert_eq!(run(&hosts, &path, &["try"]).await, "busy");
    guard.release().await.unwrap();
    assert_eq!(run(&hosts, &path, &["try"]).await, "acquired");

    let holder = curator(&hosts, &path, &["hold", "1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lock.try_lock().await.unwrap() {
            None => break,
            Some(g) => {
                // Curator has not queued yet (JVM start-up): let it.
                g.release().await.unwrap();
                assert!(Instant::now() < deadline, "Curator never took the lock");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let g = lock
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("Curator's release not seen");
    let out = tokio::task::spawn_blocking(move || output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_reads_a_distlock_id_counter() {
    let hosts = test_support::zookeeper::shared().connect_string();
    let locks = ZkProvider::connect_with(ZkOptions::new(&hosts))
        .await
        .unwrap();
    let name = unique_name("counter");
    let ids = locks.id_generator(&name, 10).unwrap();
    for _ in 0..25 {
        ids.next().await.unwrap();
    }
    // Three blocks of 10 reserved: the counter stands at 30.
    let path = locks.path(&name).unwrap();
    assert_eq!(run(&hosts, &path, &["counter"]).await, "30");
}
