//! What connecting costs: the QUIC handshake and the hello, with and without address
//! validation (a QUIC Retry), timed on the machine in use.
//!
//! `cargo bench -p monad-tests --bench connect` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`,
//! for a smoke run). Two in-process servers on loopback: one with the default settings (a Retry
//! only while the server is busy, which it never is here), one that asks every connection for
//! a Retry (`server.busy_pending_handshakes = 0`). Each figure is `Agent::connect` (a fresh UDP
//! socket, the TLS 1.3 handshake, the hello and its welcome), then the connection is closed; the
//! servers alternate round by round. See `docs/benchmarks.md`.

use std::time::{Duration, Instant};

use monad_client::agent::Agent;
use monad_tests::TestServer;
use monad_tests::bench::Stats;

fn main() {
    let quick = monad_tests::bench::quick();
    let (warmup, rounds, per_round) = if quick { (20, 4, 50) } else { (200, 10, 300) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(warmup, rounds, per_round));
}

async fn connect_once(server: &TestServer) -> Duration {
    let config = server.client_config();
    let start = Instant::now();
    let agent = Agent::connect(&config).await.expect("connects");
    let took = start.elapsed();
    agent.quic().close(0u32.into(), b"done");
    took
}

async fn run(warmup: usize, rounds: usize, per_round: usize) {
    // Closed connections leave at once, but not before the next one comes: room for a few.
    let plain = TestServer::start_with(|c| c.quotas.max_connections_per_user = 1000).await;
    let retry = TestServer::start_with(|c| {
        c.quotas.max_connections_per_user = 1000;
        c.quotas.busy_pending_handshakes = 0;
    })
    .await;
    let servers = [
        ("default (Retry only when busy)", &plain),
        ("Retry always", &retry),
    ];
    for (_, server) in servers {
        for _ in 0..warmup {
            connect_once(server).await;
        }
    }
    let mut samples = vec![Vec::new(); servers.len()];
    for round in 0..rounds {
        for k in 0..servers.len() {
            let i = (round + k) % servers.len();
            for _ in 0..per_round {
                samples[i].push(connect_once(servers[i].1).await);
            }
        }
    }
    println!(
        "Agent::connect (handshake + hello), {} per server ({rounds} rounds), median / p99:",
        rounds * per_round
    );
    let stats: Vec<Stats> = samples.iter_mut().map(|s| Stats::of(s)).collect();
    for ((name, _), stats) in servers.iter().zip(&stats) {
        println!("  {name:<34} {}", stats.show());
    }
    let extra = stats[1].median.as_secs_f64() - stats[0].median.as_secs_f64();
    println!("  Retry adds {:.0} µs at the median", extra * 1e6);
}
