//! An S3-compatible server for the object store's tests: one `moto_server` per test process, on
//! a free loopback port (never a fixed one), with its state in memory. Each test gets a fresh
//! bucket of its own ([`bucket`]).
//!
//! The server is `$MONAD_TEST_MOTO_SERVER`, else `target/s3-venv/bin/moto_server` (the
//! virtualenv `scripts/test` makes). It is started through a small shell that holds it: when the
//! test process exits (or dies), the shell's standard input closes and it stops the server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A running S3-compatible server.
#[derive(Debug)]
pub struct S3Server {
    /// Its loopback port.
    pub port: u16,
    /// The shell that holds the server; its standard input is the process's lifetime.
    _holder: Mutex<Child>,
}

/// One test's bucket: its `s3://` URL and the `AWS_*` variables that reach it.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// `s3://NAME`.
    pub url: String,
    /// `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_ALLOW_HTTP`.
    pub vars: Vec<(String, String)>,
}

impl Bucket {
    /// The variables as `(&str, &str)` pairs, for [`crate::ServerProcess::start`].
    pub fn env(&self) -> Vec<(&str, &str)> {
        self.vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The `moto_server` program.
pub fn program() -> PathBuf {
    match std::env::var_os("MONAD_TEST_MOTO_SERVER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/s3-venv/bin/moto_server"),
    }
}

static SERVER: OnceLock<Result<S3Server, String>> = OnceLock::new();

/// This process's server, started on first use; `Err` says why there is none.
pub fn server() -> Result<&'static S3Server, String> {
    SERVER
        .get_or_init(S3Server::start)
        .as_ref()
        .map_err(Clone::clone)
}

/// A fresh bucket for one test, or why there is none. Under `MONAD_TEST_REQUIRE_PEERS` a missing
/// server is a failure: the caller passes the error to [`crate::peer_missing`].
pub fn bucket() -> Result<Bucket, String> {
    server()?.create_bucket()
}

/// A port nobody listens on now, chosen by the kernel.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

impl S3Server {
    /// Starts a server on a free loopback port and waits (bounded) until it answers.
    pub fn start() -> Result<S3Server, String> {
        let program = program();
        if !program.exists() {
            return Err(format!(
                "{} is missing (scripts/test installs moto[server] into target/s3-venv)",
                program.display()
            ));
        }
        let port = free_port()?;
        let log = tempfile::Builder::new()
            .prefix("monad-s3-")
            .tempfile()
            .map_err(|e| e.to_string())?
            .into_temp_path()
            .keep()
            .map_err(|e| e.to_string())?;
        let script = format!(
            "'{program}' -H 127.0.0.1 -p {port} >'{log}' 2>&1 &
             pid=$!
             cat >/dev/null
             kill $pid; wait $pid; rm -f '{log}'",
            program = program.display(),
            log = log.display(),
        );
        let holder = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start moto_server: {e}"))?;
        let server = S3Server {
            port,
            _holder: Mutex::new(holder),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if server
                .request("GET", "/")
                .is_ok_and(|(status, _)| status == 200)
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("moto_server did not start on port {port}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP/1.1 request without a body; the status and the body.
    pub fn request(&self, method: &str, path: &str) -> Result<(u16, String), String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(|e| e.to_string())?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n",
            self.port
        )
        .map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| e.to_string())?;
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("not an HTTP response: {response:.200}"))?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// The variables that reach this server.
    pub fn vars(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "monad-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "monad-test-secret".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// A new empty bucket `t-<random>`.
    pub fn create_bucket(&self) -> Result<Bucket, String> {
        let name = format!("t-{}", crate::pg::random_hex());
        let (status, body) = self.request("PUT", &format!("/{name}"))?;
        if status != 200 {
            return Err(format!("cannot create bucket {name}: {status} {body}"));
        }
        Ok(Bucket {
            url: format!("s3://{name}"),
            vars: self.vars(),
        })
    }
}
