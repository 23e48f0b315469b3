//! Calls through one host against calls through a forwarding host (several hosts on one store).
//!
//! `cargo bench -p monad-tests --bench hosts` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`,
//! for a smoke run). Real processes on loopback: a private PostgreSQL cluster (durable,
//! PostgreSQL's defaults), host `B` and host `A` (`monad-server` release or debug binaries, as
//! the harness finds them) sharing B's certificate and one cluster secret, and a laptop's folder
//! attached to B with `--trust full` (so no one is asked). An agent calls `read_file` of a 4 KiB
//! file in the laptop's folder:
//!
//! - direct: the agent is connected to B, which holds the session's lease;
//! - forwarded: the agent is connected to A, which forwards each call to B over host-to-host
//!   QUIC (`server/src/cluster.rs`).
//!
//! Each is measured one call at a time (latency: median / p99) and with 8 calls in flight (calls
//! per second). Both record every call in PostgreSQL; the difference is the extra hop. See
//! `docs/benchmarks.md`.

use std::sync::Arc;
use std::time::Instant;

use monad_client::agent::Agent;
use monad_protocol::wire::Trust;
use monad_tests::bench::Stats;
use monad_tests::{Attachment, ServerProcess, attach_options, call_in, connect_agent, folder, ok};
use serde_json::json;

const SESSION: &str = "7a1c2e3f-4b5d-4e6f-8a9b-0c1d2e3f4a5b";
const SECRET: &str = "the-bench-hosts-secret";
const IN_FLIGHT: usize = 8;

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let quick = monad_tests::bench::quick();
    let (calls, burst) = if quick { (50, 80) } else { (1_000, 2_000) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = match monad_tests::pg::Cluster::start(monad_tests::pg::Durability::Durable) {
        Ok(cluster) => cluster,
        Err(why) => {
            println!("hosts: not run: {why}");
            return;
        }
    };
    let url = cluster.create_database().expect("a database");
    println!(
        "hosts bench ({calls} sequential calls, {burst} with {IN_FLIGHT} in flight, per side; \
         load average before: {})",
        load_average()
    );
    runtime.block_on(run(&url, calls, burst));
    println!("load average after: {}", load_average());
}

async fn start_host(
    url: &str,
    data: &std::path::Path,
    tls: Option<&std::path::Path>,
) -> ServerProcess {
    if let Some(from) = tls {
        std::fs::create_dir_all(data.join("tls")).expect("tls dir");
        for file in ["cert.pem", "key.pem"] {
            std::fs::copy(from.join("tls").join(file), data.join("tls").join(file))
                .expect("tls copied");
        }
    }
    ServerProcess::start(
        data,
        &[("MONAD_STORE_URL", url), ("MONAD_CLUSTER_SECRET", SECRET)],
    )
    .await
}

async fn run(url: &str, calls: usize, burst: usize) {
    let (data_a, data_b) = (
        tempfile::tempdir().expect("data dir"),
        tempfile::tempdir().expect("data dir"),
    );
    let b = start_host(url, data_b.path(), None).await;
    let a = start_host(url, data_a.path(), Some(data_b.path())).await;
    let token = b.first_token.clone().expect("the first host's first start");
    let content = "x".repeat(4095) + "\n";
    let laptop = folder(&[("four.txt", content.as_str())]);
    let mut options = attach_options(laptop.path(), "lap");
    options.session = Some(SESSION.into());
    options.trust = Trust::Full;
    let _attached = Attachment::start(&b.client_config(&token), options, None).await;

    let direct = Arc::new(connect_agent(&b.client_config(&token)).await);
    let forwarded = Arc::new(connect_agent(&a.client_config(&token)).await);
    for (name, agent) in [
        ("direct (agent on B)", &direct),
        ("forwarded (agent on A)", &forwarded),
    ] {
        // Warm up: the session loaded, the forwarding connection made.
        for _ in 0..20 {
            read(agent).await;
        }
        let mut samples = Vec::with_capacity(calls);
        for _ in 0..calls {
            let start = Instant::now();
            read(agent).await;
            samples.push(start.elapsed());
        }
        let stats = Stats::of(&mut samples);
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..IN_FLIGHT {
            let agent = agent.clone();
            let share = burst / IN_FLIGHT + usize::from(worker < burst % IN_FLIGHT);
            tasks.spawn(async move {
                for _ in 0..share {
                    read(&agent).await;
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a worker");
        }
        let rate = burst as f64 / start.elapsed().as_secs_f64();
        println!(
            "{name}: read_file 4 KiB {} (median / p99), {rate:.0} calls/s with {IN_FLIGHT} in flight",
            stats.show()
        );
    }
    b.stop().await;
    a.stop().await;
}

async fn read(agent: &Agent) {
    let (result, workspace) = ok(call_in(
        agent,
        Some(SESSION),
        "read_file",
        json!({"path": "four.txt", "workspace": "lap"}),
    )
    .await);
    assert_eq!(workspace, "lap");
    assert!(result.to_string().contains("xxxx"), "{result}");
}
