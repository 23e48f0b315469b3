//! A private PostgreSQL cluster for the PostgreSQL store's tests: one per test process, made
//! with `initdb` in a temporary directory and served on a free loopback port (never a fixed
//! one), as the `postgres` user when the tests run as root (PostgreSQL refuses root). Each test
//! gets a fresh database of its own ([`database`]).
//!
//! The cluster is started through a small shell that holds it: when the test process exits (or
//! dies), the shell's standard input closes, and it stops the server and removes the directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Its loopback port.
    pub port: u16,
    bin: PathBuf,
    /// The shell that holds the server; its standard input is the process's lifetime.
    _holder: Mutex<Child>,
}

/// How a cluster is run: `fsync` off for the tests (a lost machine loses a test database), on
/// for the benchmarks (durable writes, as in production).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fsync = off`, `synchronous_commit = off`.
    Tests,
    /// PostgreSQL's defaults.
    Durable,
}

/// The directory of PostgreSQL's programs: `MONAD_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` with `initdb` (Debian's layout).
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONAD_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// This process's cluster, started on first use; `Err` says why there is none (no PostgreSQL
/// installed, a start that failed).
pub fn cluster() -> Result<&'static Cluster, String> {
    CLUSTER
        .get_or_init(|| Cluster::start(Durability::Tests))
        .as_ref()
        .map_err(Clone::clone)
}

/// A fresh database of its own for one test: `postgres://monad@127.0.0.1:PORT/t_<random>`, or
/// why there is none. Under `MONAD_TEST_REQUIRE_PEERS` a missing PostgreSQL is a failure: the
/// caller passes the error to [`crate::peer_missing`].
pub fn database() -> Result<String, String> {
    cluster()?.create_database()
}

/// Whether this process runs as root.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The uid and gid of `user`, from `id`.
fn ids_of(user: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, user])
            .output()
            .map_err(|e| format!("cannot run id: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("there is no user {user} to run PostgreSQL as (not root)"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// A port nobody listens on now, chosen by the kernel.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// `program` as the cluster's owner: through `setpriv` when root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--reset-env",
        ]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl Cluster {
    /// Makes and starts a cluster in a new temporary directory.
    pub fn start(durability: Durability) -> Result<Cluster, String> {
        let bin = bin_dir().ok_or("PostgreSQL is not installed (apt-get install postgresql-15)")?;
        let dir = tempfile::Builder::new()
            .prefix("monad-pg-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep();
        if is_root() {
            let (uid, gid) = ids_of("postgres")?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
        }
        let data = dir.join("data");
        let out = as_owner(&bin.join("initdb"))
            .args([
                "--username=monad",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ])
            .arg("--pgdata")
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port()?;
        let fast = match durability {
            Durability::Tests => "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            Durability::Durable => "",
        };
        // The holder: starts the server, waits for its own standard input to close (this
        // process gone), then stops the server and removes the directory.
        let script = format!(
            "'{postgres}' -D '{data}' -p {port} -k '{dir}' -c listen_addresses=127.0.0.1 \
             -c max_connections=200 {fast} >'{dir}/log' 2>&1 &
             pid=$!
             cat >/dev/null
             kill -INT $pid; wait $pid; rm -rf '{dir}'",
            postgres = bin.join("postgres").display(),
            data = data.display(),
            dir = dir.display(),
        );
        let holder = as_owner(Path::new("/bin/sh"))
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
        let cluster = Cluster {
            port,
            bin: bin.clone(),
            // Its standard input stays open while the cluster value lives (for the tests' cluster,
            // a static: until the process exits).
            _holder: Mutex::new(holder),
        };
        // Ready when it answers (bounded).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
                return Err(format!("PostgreSQL did not start on port {port}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `postgres://monad@127.0.0.1:PORT/DB`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://monad@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs SQL with `psql` in `database`; its output, or the error.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "monad",
                "-d",
                database,
                "-c",
                sql,
            ])
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A new empty database `t_<random>`; its URL.
    pub fn create_database(&self) -> Result<String, String> {
        let name = format!("t_{}", random_hex());
        self.psql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(self.url(&name))
    }
}

/// 16 random hex digits (from the standard library's randomly seeded hasher).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}
