//! A throwaway certificate authority and a server certificate for
//! 127.0.0.1, made with the `openssl` command line tool, for TLS tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::server::require_binary;

/// A CA and a server certificate (SAN `IP:127.0.0.1`) in a temp dir.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Generates the CA, the server key and its certificate.
    ///
    /// # Panics
    ///
    /// When `openssl` is missing or fails.
    #[must_use]
    pub fn generate() -> Self {
        let openssl = require_binary("openssl");
        let dir = tempfile::Builder::new()
            .prefix("distlock-tls-")
            .tempdir()
            .expect("temp dir");
        let run = |args: &[&str]| {
            let out = Command::new(&openssl)
                .current_dir(dir.path())
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        std::fs::write(dir.path().join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
            .expect("write san.ext");
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=distlock test CA",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        TestCa { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The CA certificate (PEM file).
    #[must_use]
    pub fn ca_cert(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// The server certificate (PEM file).
    #[must_use]
    pub fn server_cert(&self) -> PathBuf {
        self.path("server.crt")
    }

    /// The server's private key (PEM file).
    #[must_use]
    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    /// The directory holding everything.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
