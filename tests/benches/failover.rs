//! The failover time: how long a laptop's attached folder is out of reach when its host dies.
//!
//! `cargo bench -p monad-tests --bench failover` (add `-- --quick`, or set
//! `MONAD_BENCH_QUICK=1`, for a smoke run of two runs). Real processes on loopback: a private
//! PostgreSQL cluster (durable, PostgreSQL's defaults) and an S3-compatible server (moto), one
//! surviving host `X` and, run by run, a fresh host `V` sharing X's certificate; the real
//! `monad-client attach` binary with a config listing V, then X. Each run SIGKILLs V and times,
//! from the kill:
//!
//! - re-attached: until the attach terminal says it is attached through X;
//! - answered: until an agent on X got the answer of a `list_dir` in the laptop's folder.
//!
//! Each run uses a session of its own, which V serves (it holds the session's lease, of the
//! default `lease_secs`, 10 s). The laptop notices the death when its QUIC connection to V times
//! out (the client's idle time-out, 8 s, with keep-alives every 2 s), then waits the backoff's
//! first wait (200 ms), connects to X and attaches; X lets the attach in once V's lease has run
//! out (V renewed it every third of `lease_secs`, so it ends 6.7 to 10 s after the kill), and
//! takes the session at a higher epoch. See `docs/benchmarks.md`.

use std::path::Path;
use std::time::{Duration, Instant};

use monad_client::config::ClientConfig;
use monad_tests::bench::{Stats, fmt_dur};
use monad_tests::{ServerProcess, command, connect_agent, folder, ok, wait_for_line};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// Each run's session: `SESSION_PREFIX` and the run's number in two hex digits (a fresh session
/// per run, so no lease of an earlier run is in the way).
const SESSION_PREFIX: &str = "5e7b0c1d-2a3f-4b6c-8d9e-0f1a2b3c4d";
/// The longest one step may take here (a start, a re-attach).
const LIMIT: Duration = Duration::from_secs(60);

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn share_tls(from: &Path, to: &Path) {
    let tls = to.join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    for file in ["cert.pem", "key.pem"] {
        std::fs::copy(from.join("tls").join(file), tls.join(file)).expect("tls copied");
    }
}

fn main() {
    let quick = monad_tests::bench::quick();
    let runs = if quick { 2 } else { 10 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = match monad_tests::pg::Cluster::start(monad_tests::pg::Durability::Durable) {
        Ok(cluster) => cluster,
        Err(why) => {
            println!("failover: not run: {why}");
            return;
        }
    };
    let s3 = match monad_tests::s3::S3Server::start() {
        Ok(s3) => s3,
        Err(why) => {
            println!("failover: not run: {why}");
            return;
        }
    };
    let url = cluster.create_database().expect("a database");
    let bucket = s3.create_bucket().expect("a bucket");
    println!(
        "failover bench ({runs} runs; load average before: {})",
        load_average()
    );
    runtime.block_on(run(runs, &url, &bucket));
    println!("load average after: {}", load_average());
}

async fn run(runs: usize, url: &str, bucket: &monad_tests::s3::Bucket) {
    let mut env: Vec<(&str, &str)> = bucket.env();
    env.push(("MONAD_STORE_URL", url));
    env.push(("MONAD_STORE_OBJECTS", bucket.url.as_str()));
    let data_x = tempfile::tempdir().expect("data dir");
    let x = ServerProcess::start(data_x.path(), &env).await;
    let token = x.first_token.clone().expect("first start");
    let agent = connect_agent(&x.client_config(&token)).await;
    let laptop = folder(&[("a.txt", "a\n")]);
    let config_dir = tempfile::tempdir().expect("config dir");
    // One device throughout: each run's attach is the same folder coming back.
    let mut config =
        ClientConfig::new(&x.addr.to_string(), &token, &x.fingerprint).expect("config");
    let (mut reattached, mut answered) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let session = format!("{SESSION_PREFIX}{run:02x}");
        let data_v = tempfile::tempdir().expect("data dir");
        share_tls(data_x.path(), data_v.path());
        let v = ServerProcess::start(data_v.path(), &env).await;
        config.server = v.addr.to_string();
        config.servers = vec![x.addr.to_string()];
        config.save(config_dir.path()).expect("config saved");
        let mut attach = command("monad-client")
            .arg("attach")
            .arg(laptop.path())
            .args(["--session", &session, "--name", "lap", "--non-interactive"])
            .args(["--allow", "read"])
            .env("MONAD_CONFIG_DIR", config_dir.path())
            .spawn()
            .expect("monad-client starts");
        let mut said = tokio::io::BufReader::new(attach.stderr.take().expect("piped")).lines();
        let on_v = format!(" on {} ", v.addr);
        wait_for_line(&mut said, LIMIT, "the attach through V", |l| {
            l.starts_with("attached ") && l.contains(&on_v)
        })
        .await;

        let killed = Instant::now();
        v.kill().await;
        let on_x = format!(" on {} ", x.addr);
        wait_for_line(&mut said, LIMIT, "the re-attach through X", |l| {
            l.starts_with("attached ") && l.contains(&on_x)
        })
        .await;
        reattached.push(killed.elapsed());
        let (_, ran_in) = ok(monad_tests::call_in(
            &agent,
            Some(&session),
            "list_dir",
            json!({"workspace": "lap"}),
        )
        .await);
        answered.push(killed.elapsed());
        assert_eq!(ran_in, "lap");

        // Detach (SIGTERM tells X at once) before the next run's laptop comes.
        let pid = attach.id().expect("running") as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM sent");
        tokio::time::timeout(LIMIT, attach.wait())
            .await
            .expect("attach exits")
            .expect("attach reaped");
    }
    println!("from SIGKILL of the laptop's host, {runs} runs (median / max):");
    for (name, samples) in [
        ("re-attached through another host", &mut reattached),
        ("a call into the folder answered there", &mut answered),
    ] {
        let median = Stats::of(samples).median; // sorts them
        let max = *samples.last().expect("runs");
        let all: Vec<String> = samples.iter().map(|d| fmt_dur(*d)).collect();
        println!(
            "  {name:<40} {} / {}   (all: {})",
            fmt_dur(median),
            fmt_dur(max),
            all.join(", ")
        );
    }
    drop(agent);
    x.stop().await;
}
