//! Apache Curator 5.4 peers (Debian's `libcurator-recipes-java`) for interop
//! tests: the Java programs in `test-support/java/`, compiled once per test
//! binary and run as separate JVM processes.
//!
//! Each peer class takes `HOSTS PATH MODE [ARGS...]` and prints one line per
//! event on standard output.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The jars of Curator 5.4 and its dependencies (Debian's paths): the class
/// path peers outside `test-support/java/` compile and run against.
pub const JARS: &[&str] = &[
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/curator-recipes.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/guava.jar",
    "/usr/share/java/slf4j-api.jar",
    "/usr/share/java/slf4j-simple.jar",
];

/// Compiles every peer in `test-support/java/` once per test binary;
/// returns the class path to run them with.
///
/// # Panics
///
/// When a jar or the JDK is missing (naming the install script), or javac
/// fails.
pub fn classpath() -> &'static str {
    static CLASSPATH: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    &CLASSPATH
        .get_or_init(|| {
            for jar in JARS {
                assert!(
                    Path::new(jar).is_file(),
                    "{jar} is missing: run scripts/install-servers.sh (installs libcurator-recipes-java)"
                );
            }
            let out = tempfile::Builder::new()
                .prefix("distlock-curator-")
                .tempdir()
                .expect("a temporary directory for the compiled peers");
            let jars = JARS.join(":");
            let sources_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("java");
            let mut sources: Vec<PathBuf> = std::fs::read_dir(&sources_dir)
                .expect("test-support/java exists")
                .map(|e| e.expect("a directory entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "java"))
                .collect();
            sources.sort();
            let status = Command::new("javac")
                .args(["-cp", &jars, "-d"])
                .arg(out.path())
                .args(&sources)
                .status()
                .expect("javac runs (a JDK is installed by scripts/install-servers.sh)");
            assert!(status.success(), "javac failed on {sources:?}");
            let classpath = format!("{}:{jars}", out.path().display());
            (out, classpath)
        })
        .1
}

/// Starts the peer `class` (`CuratorPeer`, ...) on `hosts` and `path` with
/// `args`, its standard output and error piped.
///
/// # Panics
///
/// When java cannot be started.
#[must_use]
pub fn spawn(class: &str, hosts: &str, path: &str, args: &[&str]) -> Child {
    Command::new("java")
        .args([
            "-cp",
            classpath(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            class,
        ])
        .args([hosts, path])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("java runs")
}

/// Waits for a peer and returns its trimmed standard output.
///
/// # Panics
///
/// When the peer failed, with its standard error.
#[must_use]
pub fn output(child: Child) -> String {
    let out = child.wait_with_output().expect("wait for the Curator peer");
    assert!(
        out.status.success(),
        "Curator peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs the peer `class` to the end on a blocking thread; its output.
///
/// # Panics
///
/// As [`spawn`] and [`output`].
pub async fn run(class: &str, hosts: &str, path: &str, args: &[&str]) -> String {
    let (class, hosts, path) = (class.to_owned(), hosts.to_owned(), path.to_owned());
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        output(spawn(&class, &hosts, &path, &args))
    })
    .await
    .expect("the peer's thread")
}
