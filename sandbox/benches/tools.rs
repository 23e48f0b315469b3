//! Monad's tools against the direct operation they wrap, timed in the same run.
//!
//! `cargo bench -p monad-sandbox --bench tools` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`,
//! for a smoke run with few iterations). No external harness: each pair of operations is warmed
//! up, then timed call by call, alternating which of the two goes first, and reported as median
//! and 99th percentile with the ratio of the medians (Monad / direct). See `docs/benchmarks.md`.
//!
//! Figures:
//! 1. `read_file` of a 4 KiB text file vs `std::fs::read` + `String::from_utf8`.
//! 2. `list_dir` of a directory of 10,000 entries vs `std::fs::read_dir` collecting names and
//!    file types.
//! 3. `search` for a regex over 10,000 files vs the `rg` binary run as a process (skipped,
//!    loudly, when `rg` is not installed).
//! 4. `run_command` of `true` under the sandbox (by default, with the host's network, and
//!    without namespaces) vs a plain `tokio::process::Command` spawn+wait; target: at most 2 ms
//!    added.
//! 5. `process_write` then `process_read` of a line through a background `cat` vs the same
//!    through a plain child's pipes.

use std::ffi::OsString;
use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use monad_protocol::tools::{ListDirArgs, ReadFileArgs, RunCommandArgs, SearchArgs};
use monad_sandbox::{ExecPolicy, Limits, Sandbox, SandboxError};

/// Entries in the `list_dir` fixture.
const LIST_ENTRIES: usize = 10_000;
/// Of which directories (the rest are regular files).
const LIST_DIRS: usize = 100;
/// The `search` fixture: this many directories of this many files.
const SEARCH_DIRS: usize = 100;
const SEARCH_FILES_PER_DIR: usize = 100;
/// Every file whose index is a multiple of this holds one matching line.
const SEARCH_MATCH_EVERY: usize = 997;
/// The regex searched for.
const SEARCH_PATTERN: &str = r"needle_[0-9]+\(";

/// Iteration counts of one figure.
#[derive(Clone, Copy)]
struct Plan {
    warmup: usize,
    iters: usize,
}

impl Plan {
    fn new(quick: bool, warmup: usize, iters: usize) -> Plan {
        if quick {
            Plan {
                warmup: warmup.div_ceil(10),
                iters: iters.div_ceil(20).max(3),
            }
        } else {
            Plan { warmup, iters }
        }
    }
}

/// Median and 99th percentile of a set of timings.
#[derive(Clone, Copy)]
struct Stats {
    median: Duration,
    p99: Duration,
}

impl Stats {
    fn of(samples: &mut [Duration]) -> Stats {
        assert!(!samples.is_empty());
        samples.sort_unstable();
        let at = |q: f64| {
            // Nearest rank: the smallest sample with at least q of all samples at or below it.
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1]
        };
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2
        };
        Stats {
            median,
            p99: at(0.99),
        }
    }
}

/// Times `monad` and `direct` alternately (`plan.iters` calls each, after `plan.warmup` untimed
/// calls each), switching which goes first every iteration so neither always runs on a cache
/// the other just warmed.
fn pair(plan: Plan, mut monad: impl FnMut(), mut direct: impl FnMut()) -> (Stats, Stats) {
    for _ in 0..plan.warmup {
        monad();
        direct();
    }
    let mut m = Vec::with_capacity(plan.iters);
    let mut d = Vec::with_capacity(plan.iters);
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    for i in 0..plan.iters {
        if i % 2 == 0 {
            m.push(time(&mut monad));
            d.push(time(&mut direct));
        } else {
            d.push(time(&mut direct));
            m.push(time(&mut monad));
        }
    }
    (Stats::of(&mut m), Stats::of(&mut d))
}

fn fmt_dur(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

fn header() {
    println!(
        "{:<24} {:>22} {:>22} {:>7} {:>7}  {:<7} note",
        "operation", "monad median / p99", "direct median / p99", "ratio", "target", "verdict"
    );
    println!("{}", "-".repeat(110));
}

/// One result line. `target` is the highest acceptable ratio; `None` reports without a verdict.
fn report(name: &str, monad: Stats, direct: Stats, target: Option<f64>, note: &str) -> f64 {
    let ratio = monad.median.as_secs_f64() / direct.median.as_secs_f64();
    let (target_s, verdict) = match target {
        Some(t) if ratio <= t => (format!("{t:.2}x"), "PASS"),
        Some(t) => (format!("{t:.2}x"), "OVER"),
        None => ("-".to_owned(), "INFO"),
    };
    println!(
        "{:<24} {:>22} {:>22} {:>6.2}x {:>7}  {:<7} {}",
        name,
        format!("{} / {}", fmt_dur(monad.median), fmt_dur(monad.p99)),
        format!("{} / {}", fmt_dur(direct.median), fmt_dur(direct.p99)),
        ratio,
        target_s,
        verdict,
        note
    );
    ratio
}

fn write(path: &Path, content: &[u8]) {
    std::fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Builds every fixture under `root`.
fn fixtures(root: &Path) {
    // 1. A 4 KiB text file: 64 lines of 63 characters and a newline.
    std::fs::create_dir(root.join("read")).unwrap();
    let mut text = String::with_capacity(4096);
    for i in 0..64 {
        let line = format!("{i:04} the quick brown fox jumps over the lazy dog; lorem ipsum");
        text.push_str(&format!("{line:<63}\n"));
    }
    assert_eq!(text.len(), 4096);
    write(&root.join("read/sample.txt"), text.as_bytes());

    // 2. One directory of 10,000 entries, 100 of them directories.
    let list = root.join("list");
    std::fs::create_dir(&list).unwrap();
    for i in 0..LIST_ENTRIES {
        if i < LIST_DIRS {
            std::fs::create_dir(list.join(format!("dir_{i:05}"))).unwrap();
        } else {
            write(&list.join(format!("file_{i:05}.rs")), b"");
        }
    }

    // 3. 100 directories of 100 small source-like files, a handful of matches, plus what both
    // tools must skip: hidden files and files ignored by a `.gitignore` (no git repository).
    let search = root.join("search");
    std::fs::create_dir(&search).unwrap();
    for d in 0..SEARCH_DIRS {
        let dir = search.join(format!("mod_{d:02}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..SEARCH_FILES_PER_DIR {
            let index = d * SEARCH_FILES_PER_DIR + f;
            let mut body = format!(
                "// file {index}\nuse std::collections::HashMap;\n\n\
                 pub fn helper_{index}(x: u64) -> u64 {{\n    x.wrapping_mul({index}) ^ 0x5f\n}}\n"
            );
            if index.is_multiple_of(SEARCH_MATCH_EVERY) {
                body.push_str(&format!("fn needle_{index}() {{}}\n"));
            }
            write(&dir.join(format!("src_{f:02}.rs")), body.as_bytes());
        }
    }
    write(&search.join(".gitignore"), b"*.log\n");
    write(&search.join("mod_00/skipped.log"), b"fn needle_1() {}\n");
    std::fs::create_dir(search.join(".hidden")).unwrap();
    write(&search.join(".hidden/x.rs"), b"fn needle_2() {}\n");
    write(&search.join("mod_01/.hidden.rs"), b"fn needle_3() {}\n");
}

fn expected_search_matches() -> usize {
    (0..SEARCH_DIRS * SEARCH_FILES_PER_DIR)
        .filter(|i| i % SEARCH_MATCH_EVERY == 0)
        .count()
}

fn bench_read_file(quick: bool, root: &Path, sandbox: &Sandbox) {
    let args = ReadFileArgs {
        path: "read/sample.txt".into(),
        offset: None,
        limit: None,
        workspace: None,
    };
    let abs = root.join("read/sample.txt");
    let check = sandbox.read_file(&args).expect("read_file");
    assert_eq!(check.size, 4096);
    assert!(!check.truncated && !check.binary);
    assert_eq!(
        check.content.as_bytes(),
        std::fs::read(&abs).unwrap().as_slice()
    );
    let (m, d) = pair(
        Plan::new(quick, 2_000, 20_000),
        || {
            black_box(sandbox.read_file(black_box(&args)).unwrap());
        },
        || {
            let bytes = std::fs::read(black_box(&abs)).unwrap();
            black_box(String::from_utf8(bytes).unwrap());
        },
    );
    report(
        "read_file 4 KiB",
        m,
        d,
        Some(1.5),
        "vs fs::read + from_utf8",
    );
}

fn bench_list_dir(quick: bool, root: &Path, sandbox: &Sandbox) {
    let args = ListDirArgs {
        path: Some("list".into()),
        depth: None,
        include_hidden: None,
        workspace: None,
    };
    let abs = root.join("list");
    let check = sandbox.list_dir(&args).expect("list_dir");
    assert_eq!(check.entries.len(), LIST_ENTRIES);
    assert!(!check.truncated);
    let direct = || -> Vec<(OsString, std::fs::FileType)> {
        std::fs::read_dir(&abs)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.file_type().unwrap())
            })
            .collect()
    };
    assert_eq!(direct().len(), LIST_ENTRIES);
    let (m, d) = pair(
        Plan::new(quick, 20, 300),
        || {
            let r = sandbox.list_dir(black_box(&args)).unwrap();
            assert_eq!(r.entries.len(), LIST_ENTRIES);
            black_box(r);
        },
        || {
            let r = direct();
            assert_eq!(r.len(), LIST_ENTRIES);
            black_box(r);
        },
    );
    report(
        "list_dir 10k entries",
        m,
        d,
        Some(1.5),
        "vs fs::read_dir (name + type)",
    );
    // Monad returns entries sorted by name with their path; show what sorting costs the baseline.
    let (m, d) = pair(
        Plan::new(quick, 10, 100),
        || {
            black_box(sandbox.list_dir(black_box(&args)).unwrap());
        },
        || {
            let mut r = direct();
            r.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            black_box(r);
        },
    );
    report(
        "list_dir 10k (sorted)",
        m,
        d,
        None,
        "baseline also sorts by name",
    );
}

/// Runs `rg` over `dir` and returns the number of output lines (one per matching line).
fn rg(dir: &Path, threads: Option<usize>) -> usize {
    let mut cmd = Command::new("rg");
    cmd.arg("--no-config").arg("--no-require-git").arg("-n");
    if let Some(j) = threads {
        cmd.arg(format!("-j{j}"));
    }
    let mut child = cmd
        .arg(SEARCH_PATTERN)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rg");
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "rg failed: {status}");
    out.iter().filter(|&&b| b == b'\n').count()
}

fn rg_available() -> bool {
    Command::new("rg")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn bench_search(quick: bool, root: &Path, sandbox: &Sandbox) {
    let args = SearchArgs {
        pattern: SEARCH_PATTERN.into(),
        path: Some("search".into()),
        glob: None,
        case_insensitive: None,
        max_results: Some(100_000),
        include_hidden: None,
        context: None,
        files_only: None,
        workspace: None,
    };
    let expected = expected_search_matches();
    let check = sandbox.search(&args).expect("search");
    assert_eq!(check.matches.len(), expected, "monad's match count");
    assert!(!check.truncated);
    assert_eq!(
        check.files_searched as usize,
        SEARCH_DIRS * SEARCH_FILES_PER_DIR
    );
    if !rg_available() {
        println!(
            "{:<24} SKIPPED: the `rg` binary is not installed (apt-get install ripgrep)",
            "search 10k files"
        );
        return;
    }
    let abs = root.join("search");
    assert_eq!(rg(&abs, None), expected, "rg's match count");
    let monad = || {
        let r = sandbox.search(black_box(&args)).unwrap();
        assert_eq!(r.matches.len(), expected);
        black_box(r);
    };
    let (m, d) = pair(Plan::new(quick, 3, 41), monad, || {
        assert_eq!(rg(&abs, None), expected);
    });
    report(
        "search 10k files",
        m,
        d,
        Some(1.3),
        "vs `rg --no-require-git -n` (process)",
    );
    // Same, with rg held to one thread like Monad's walk: separates walker speed from threading.
    let (m, d) = pair(Plan::new(quick, 2, 21), monad, || {
        assert_eq!(rg(&abs, Some(1)), expected);
    });
    report("search 10k files", m, d, None, "vs `rg -j1` (one thread)");
}

/// A workspace for commands under `root`, made as a server makes its primary workspaces: when
/// the bench runs as root, the folder is given to a user of its own, whom commands run as.
fn command_root(root: &Path) -> PathBuf {
    let dir = root.join("commands");
    std::fs::create_dir_all(&dir).unwrap();
    monad_sandbox::exec::give_to_command_user(&dir, &ExecPolicy::default()).unwrap();
    dir
}

/// Times the three async operations in rotation after warming them up.
fn rotate3<F1, F2, F3, R1, R2, R3>(
    rt: &tokio::runtime::Runtime,
    plan: Plan,
    a: F1,
    b: F2,
    c: F3,
) -> [Stats; 3]
where
    F1: Fn() -> R1,
    F2: Fn() -> R2,
    F3: Fn() -> R3,
    R1: std::future::Future<Output = ()>,
    R2: std::future::Future<Output = ()>,
    R3: std::future::Future<Output = ()>,
{
    rt.block_on(async {
        for _ in 0..plan.warmup {
            a().await;
            b().await;
            c().await;
        }
        let mut samples: [Vec<Duration>; 3] = Default::default();
        for i in 0..plan.iters {
            // Rotate the order so no variant always follows the same one.
            for k in 0..3 {
                let which = (i + k) % 3;
                let t = Instant::now();
                match which {
                    0 => a().await,
                    1 => b().await,
                    _ => c().await,
                }
                samples[which].push(t.elapsed());
            }
        }
        samples.map(|mut s| Stats::of(&mut s))
    })
}

/// Most a command's sandbox may add to a plain spawn (issue target).
const RUN_OVERHEAD_TARGET: Duration = Duration::from_millis(2);

fn bench_run_command(quick: bool, root: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let root = command_root(root);
    let root = root.as_path();
    let args = RunCommandArgs {
        argv: vec!["true".into()],
        ..Default::default()
    };
    // The same process shape as `run_command` (scrubbed environment with the sandbox's PATH, own
    // process group, stdin from /dev/null, stdout and stderr piped and read to the end) with no
    // sandbox: separates what the sandbox costs from what the shape costs.
    let tmp_env = root.join("run-tmp");
    std::fs::create_dir_all(&tmp_env).unwrap();
    let env = [
        ("PATH", ExecPolicy::default().path_env),
        ("HOME", root.display().to_string()),
        ("PWD", root.display().to_string()),
        ("TMPDIR", tmp_env.display().to_string()),
        ("LANG", "C.UTF-8".to_owned()),
        ("TERM", "dumb".to_owned()),
    ];
    let direct = || async {
        let status = tokio::process::Command::new("true")
            .spawn()
            .unwrap()
            .wait()
            .await
            .unwrap();
        assert!(status.success());
    };
    let shaped = || async {
        let mut child = tokio::process::Command::new("true")
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(root)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (ra, rb, status) = tokio::join!(
            tokio::io::AsyncReadExt::read_to_end(&mut out, &mut a),
            tokio::io::AsyncReadExt::read_to_end(&mut err, &mut b),
            child.wait()
        );
        ra.unwrap();
        rb.unwrap();
        assert!(status.unwrap().success());
    };
    // A server's commands join their user's process group (a cgroup) first.
    let bounds = monad_sandbox::exec::cgroup::Bounds {
        processes: 4096,
        memory_bytes: 1 << 30,
        cpu_percent: Some(0),
    };
    let groups = match monad_sandbox::exec::cgroup::ProcessGroups::create(bounds, None) {
        Ok(groups) => Some(std::sync::Arc::new(groups)),
        Err(why) => {
            println!("note: no process groups here ({why}); that variant is not timed");
            None
        }
    };
    let variants = [
        (
            "default (namespaces, no network)",
            ExecPolicy::default(),
            false,
        ),
        (
            "namespaces, host network",
            ExecPolicy {
                network: monad_sandbox::NetworkMode::Host,
                ..ExecPolicy::default()
            },
            false,
        ),
        (
            "no namespaces (fallback)",
            ExecPolicy {
                namespaces: monad_sandbox::NamespacePolicy::Off,
                ..ExecPolicy::default()
            },
            false,
        ),
        (
            "default, in a user's process group (a server's commands)",
            ExecPolicy::default(),
            true,
        ),
    ];
    for (label, policy, grouped) in variants {
        let open = |policy| {
            let sandbox = Sandbox::open(root, Limits::default(), policy).unwrap();
            match &groups {
                Some(groups) if grouped => sandbox.in_process_group(groups.clone(), "bench"),
                _ => sandbox,
            }
        };
        if grouped && groups.is_none() {
            continue;
        }
        let mut sandbox = open(policy);
        let mut note = label.to_owned();
        match rt.block_on(sandbox.run_command(&args)) {
            Ok(r) => {
                assert_eq!(r.exit_code, Some(0));
                assert_eq!(r.sandbox, "landlock");
            }
            Err(SandboxError::SandboxUnavailable(why)) => {
                println!("note: sandbox unavailable ({why}); run_command timed WITHOUT a sandbox");
                let policy = ExecPolicy {
                    allow_unsandboxed_exec: true,
                    ..ExecPolicy::default()
                };
                sandbox = open(policy);
                note = format!("UNSANDBOXED (no landlock): {label}");
            }
            Err(e) => panic!("run_command: {e}"),
        }
        let monad = || async {
            let r = sandbox.run_command(&args).await.unwrap();
            assert_eq!(r.exit_code, Some(0));
        };
        let [m, d, s] = rotate3(&rt, Plan::new(quick, 50, 1000), monad, direct, shaped);
        let added = m.median.saturating_sub(d.median);
        let verdict = if added <= RUN_OVERHEAD_TARGET {
            "PASS"
        } else {
            "OVER"
        };
        report(
            "run_command `true`",
            m,
            d,
            None,
            &format!(
                "{note}: +{} vs plain spawn ({verdict}: target +{}); +{} vs same shape",
                fmt_dur(added),
                fmt_dur(RUN_OVERHEAD_TARGET),
                fmt_dur(m.median.saturating_sub(s.median)),
            ),
        );
    }
}

/// `process_read` of streamed output: a background `cat` echoes each line written to it; one
/// round is `process_write` of a line, then `process_read` (waiting) until the line is back.
/// Against the same through a plain child's pipes.
fn bench_process_read(quick: bool, root: &Path) {
    use monad_protocol::ToolName;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let root = command_root(root);
    let sandbox = std::sync::Arc::new(
        Sandbox::open(&root, Limits::default(), ExecPolicy::default()).unwrap(),
    );
    let started = rt
        .block_on(sandbox.call(
            ToolName::RunCommand,
            json!({"argv": ["cat"], "background": true}),
        ))
        .expect("a background cat");
    let id = started["process"].as_str().unwrap().to_owned();
    let monad_round = || {
        let (sandbox, id) = (sandbox.clone(), id.clone());
        async move {
            sandbox
                .call(
                    ToolName::ProcessWrite,
                    json!({"process": id, "text": "ping\n"}),
                )
                .await
                .unwrap();
            let mut seen = String::new();
            while !seen.ends_with("ping\n") {
                let r = sandbox
                    .call(
                        ToolName::ProcessRead,
                        json!({"process": id, "wait_ms": 1000}),
                    )
                    .await
                    .unwrap();
                seen.push_str(r["stdout"].as_str().unwrap());
            }
        }
    };
    let mut child = rt.block_on(async {
        tokio::process::Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    });
    let stdin = tokio::sync::Mutex::new(child.stdin.take().unwrap());
    let stdout = tokio::sync::Mutex::new(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let direct_round = || async {
        stdin.lock().await.write_all(b"ping\n").await.unwrap();
        let mut line = String::new();
        stdout.lock().await.read_line(&mut line).await.unwrap();
        assert_eq!(line, "ping\n");
    };
    let idle = || async {};
    let [m, d, _] = rotate3(
        &rt,
        Plan::new(quick, 50, 1000),
        monad_round,
        direct_round,
        idle,
    );
    report(
        "process_write + read",
        m,
        d,
        None,
        "a line through a background `cat` vs a plain child's pipes",
    );
    rt.block_on(sandbox.call(
        ToolName::ProcessKill,
        json!({"process": id, "signal": "KILL"}),
    ))
    .unwrap();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("MONAD_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let started = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("monad-bench-")
        .tempdir()
        .expect("temporary directory");
    let root: PathBuf = tmp.path().canonicalize().unwrap();
    fixtures(&root);
    let limits = Limits {
        list_max_entries: 2 * LIST_ENTRIES,
        search_max_results: 100_000,
        ..Limits::default()
    };
    let sandbox = Sandbox::open(&root, limits, ExecPolicy::default()).expect("open sandbox");
    println!(
        "monad-sandbox tools bench{} (fixtures in {}, built in {})",
        if quick { " --quick" } else { "" },
        root.display(),
        fmt_dur(started.elapsed())
    );
    header();
    bench_read_file(quick, &root, &sandbox);
    bench_list_dir(quick, &root, &sandbox);
    bench_search(quick, &root, &sandbox);
    bench_run_command(quick, &root);
    bench_process_read(quick, &root);
    println!("total {}", fmt_dur(started.elapsed()));
}
