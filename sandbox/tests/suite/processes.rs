//! Background processes: `run_command` with `background` or `background_after_ms`, then
//! `process_read`, `process_write`, `process_kill` and `process_list`, through `Sandbox::call`
//! as an agent's calls arrive.

use std::sync::{Arc, Mutex};

use monad_protocol::ToolName;
use monad_protocol::tools::{ProcessListResult, ProcessReadResult, RunCommandResult};
use monad_sandbox::{ExecPolicy, Limits, SandboxError};
use serde_json::{Value, json};

use super::support::{Fixture, runtime};

/// The runtime background processes live on, across calls (as a server's or a client's does);
/// one per test thread.
fn rt() -> &'static tokio::runtime::Runtime {
    thread_local! {
        static RT: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime()));
    }
    RT.with(|rt| *rt)
}

fn call(fx: &Fixture, tool: ToolName, args: Value) -> Result<Value, SandboxError> {
    rt().block_on(fx.sandbox.call(tool, args))
}

fn start(fx: &Fixture, script: &str) -> String {
    let out: RunCommandResult = serde_json::from_value(
        call(
            fx,
            ToolName::RunCommand,
            json!({"argv": ["sh", "-c", script], "background": true}),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!((out.exit_code, out.signal), (None, None), "{out:?}");
    out.process.expect("a process id")
}

fn read(fx: &Fixture, process: &str, wait_ms: u64) -> ProcessReadResult {
    serde_json::from_value(
        call(
            fx,
            ToolName::ProcessRead,
            json!({"process": process, "wait_ms": wait_ms}),
        )
        .unwrap(),
    )
    .unwrap()
}

/// Reads until `stdout` (all of it, over several reads) satisfies `done`, or the process ends.
fn read_until(
    fx: &Fixture,
    process: &str,
    done: impl Fn(&str) -> bool,
) -> (String, ProcessReadResult) {
    let mut seen = String::new();
    loop {
        let r = read(fx, process, 10_000);
        seen.push_str(&r.stdout);
        if done(&seen) || !r.running {
            return (seen, r);
        }
    }
}

#[test]
fn a_background_command_is_read_while_it_runs_and_written_to() {
    let fx = Fixture::new();
    let id = start(
        &fx,
        "echo started; while read line; do echo \"got $line\"; done; echo \"input closed\"; exit 3",
    );
    let (seen, r) = read_until(&fx, &id, |s| s.contains("started"));
    assert!(r.running, "{r:?}");
    assert_eq!(seen, "started\n");
    let wrote = call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": id, "text": "one\ntwo\n"}),
    )
    .unwrap();
    assert_eq!(wrote["bytes_written"], 8);
    let (seen, _) = read_until(&fx, &id, |s| s.contains("got two"));
    assert_eq!(seen, "got one\ngot two\n");
    call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": id, "text": "", "close_stdin": true}),
    )
    .unwrap();
    let (seen, r) = read_until(&fx, &id, |_| false);
    assert_eq!(seen, "input closed\n");
    assert_eq!((r.running, r.exit_code), (false, Some(3)), "{r:?}");
    // Read to the end: a read again tells how it ended, with nothing new.
    let again = read(&fx, &id, 0);
    assert_eq!(
        (again.running, again.exit_code, again.stdout.as_str()),
        (false, Some(3), ""),
        "{again:?}"
    );
}

fn last_lines(fx: &Fixture, process: &str, n: u64) -> Result<ProcessReadResult, SandboxError> {
    let args = json!({"process": process, "last_lines": n});
    call(fx, ToolName::ProcessRead, args).map(|v| serde_json::from_value(v).unwrap())
}

#[test]
fn a_process_read_to_its_end_shows_its_last_lines_again_for_a_while() {
    use monad_protocol::ErrorCode;
    let fx = Fixture::new();
    let id = start(&fx, "seq 1 5; echo oops >&2; exit 2");
    let (seen, r) = read_until(&fx, &id, |_| false);
    assert_eq!((seen.as_str(), r.running), ("1\n2\n3\n4\n5\n", false));
    let r = last_lines(&fx, &id, 2).unwrap();
    assert_eq!(
        (r.stdout.as_str(), r.stderr.as_str(), r.exit_code, r.running),
        ("4\n5\n", "oops\n", Some(2), false),
        "{r:?}"
    );
    assert_eq!(r.last_lines, Some(2));
    // The approval's check agrees; it is not listed, signalled or written to.
    let check = |tool, args: Value| fx.sandbox.check(tool, &args).map_err(|e| e.code());
    check(
        ToolName::ProcessRead,
        json!({"process": id, "last_lines": 1}),
    )
    .unwrap();
    let listed: ProcessListResult =
        serde_json::from_value(call(&fx, ToolName::ProcessList, json!({})).unwrap()).unwrap();
    assert!(listed.processes.is_empty(), "{listed:?}");
    for (tool, args) in [
        (ToolName::ProcessKill, json!({"process": id})),
        (ToolName::ProcessWrite, json!({"process": id, "text": "x"})),
    ] {
        let err = call(&fx, tool, args.clone()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
        assert!(err.to_string().contains("told its end"), "{err}");
        assert_eq!(check(tool, args), Err(ErrorCode::InvalidArguments));
    }
    // Of a long output, the last 64 KiB, from a whole line on.
    let big = start(&fx, "seq 1 100000");
    read_until(&fx, &big, |_| false);
    assert_eq!(last_lines(&fx, &big, 1).unwrap().stdout, "100000\n");
    let all = last_lines(&fx, &big, 1_000_000).unwrap().stdout;
    assert!(
        all.len() <= 64 * 1024 && all.len() > 60 * 1024,
        "{}",
        all.len()
    );
    let first: u32 = all.lines().next().unwrap().parse().unwrap();
    assert_eq!(all.lines().count(), 100_000 - first as usize + 1);
    // The newest eight so read are kept: the first goes once eight more have been.
    for _ in 0..7 {
        let p = start(&fx, "echo x");
        read_until(&fx, &p, |_| false);
    }
    let err = last_lines(&fx, &id, 1).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert_eq!(
        check(ToolName::ProcessRead, json!({"process": id})),
        Err(ErrorCode::NotFound)
    );
    assert_eq!(last_lines(&fx, &big, 1).unwrap().stdout, "100000\n");
}

#[test]
fn output_stays_until_read_after_the_process_exits() {
    let fx = Fixture::new();
    let id = start(&fx, "echo one; echo two >&2; exit 0");
    // Listed, exited, with its output waiting.
    let listed: ProcessListResult = loop {
        let listed: ProcessListResult =
            serde_json::from_value(call(&fx, ToolName::ProcessList, json!({})).unwrap()).unwrap();
        if !listed.processes[0].running {
            break listed;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(listed.processes.len(), 1);
    assert_eq!(listed.processes[0].unread_bytes, 8, "{listed:?}");
    let r = read(&fx, &id, 0);
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("one\n", "two\n"));
    assert!(!r.running);
    let listed: ProcessListResult =
        serde_json::from_value(call(&fx, ToolName::ProcessList, json!({})).unwrap()).unwrap();
    assert!(listed.processes.is_empty(), "{listed:?}");
}

#[test]
fn process_kill_signals_the_process_and_kill_ends_its_tree() {
    let fx = Fixture::new();
    let term = start(
        &fx,
        "trap 'echo terminated; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
    );
    read_until(&fx, &term, |s| s.contains("ready"));
    let sent = call(&fx, ToolName::ProcessKill, json!({"process": term})).unwrap();
    assert_eq!(
        (sent["signal"].as_str(), sent["delivered"].as_bool()),
        (Some("TERM"), Some(true))
    );
    let (seen, r) = read_until(&fx, &term, |_| false);
    assert_eq!(seen, "terminated\n");
    assert_eq!(r.exit_code, Some(7), "{r:?}");

    // KILL takes everything, whatever it does with signals, escapees included.
    let kill = start(
        &fx,
        "trap '' TERM INT; (setsid sh -c 'exec 9>>held.lock; flock 9; echo held > held.ready; \
         exec sleep 60' &); while [ ! -s held.ready ]; do sleep 0.01; done; echo ready; sleep 60",
    );
    read_until(&fx, &kill, |s| s.contains("ready"));
    call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": kill, "signal": "SIGKILL"}),
    )
    .unwrap();
    let (_, r) = read_until(&fx, &kill, |_| false);
    assert_eq!(r.signal, Some(9), "{r:?}");
    let file = std::fs::File::open(fx.root().join("held.lock")).unwrap();
    assert!(
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok(),
        "the escapee outlived process_kill KILL"
    );
    let err = call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": "proc-nothere"}),
    )
    .unwrap_err();
    assert_eq!(err.code(), monad_protocol::ErrorCode::NotFound);
    let err = call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": "x", "signal": "STOP"}),
    )
    .unwrap_err();
    assert_eq!(err.code(), monad_protocol::ErrorCode::InvalidArguments);
}

#[test]
fn a_foreground_command_can_move_to_the_background_when_it_runs_long() {
    let fx = Fixture::new();
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({
                "argv": ["sh", "-c", "echo early; while [ ! -e go ]; do sleep 0.02; done; echo late; \
                          while [ ! -e stop ]; do sleep 0.02; done"],
                "background_after_ms": 300,
            }),
        )
        .unwrap(),
    )
    .unwrap();
    let id = out.process.clone().expect("moved to the background");
    assert_eq!(
        (out.stdout.as_str(), out.exit_code),
        ("early\n", None),
        "{out:?}"
    );
    fx.put("go", "");
    let (seen, r) = read_until(&fx, &id, |s| s.contains("late"));
    assert_eq!((seen.as_str(), r.running), ("late\n", true));
    // What the first answer showed is kept too, for reading the last lines again.
    let again: ProcessReadResult = serde_json::from_value(
        call(
            &fx,
            ToolName::ProcessRead,
            json!({"process": id, "last_lines": 5}),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(again.stdout, "early\nlate\n", "{again:?}");
    // Its standard input is closed, and the refusal says why (it said only "is closed").
    let refused = call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": id, "text": "more\n"}),
    )
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("is closed") && refused.contains("`background_after_ms`"),
        "{refused}"
    );
    fx.put("stop", "");
    let (seen, r) = read_until(&fx, &id, |_| false);
    assert_eq!(seen, "");
    assert_eq!(r.exit_code, Some(0));
    // One that finishes in time answers as before.
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({"argv": ["echo", "quick"], "background_after_ms": 10_000}),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.exit_code, out.process),
        ("quick\n", Some(0), None)
    );
}

#[test]
fn background_processes_are_bounded_and_their_output_keeps_the_newest() {
    let fx = Fixture::with(
        Limits {
            output_max_bytes: 100,
            ..Limits::default()
        },
        ExecPolicy {
            max_background: 2,
            ..Default::default()
        },
    );
    let noisy = start(
        &fx,
        // The 100 lines go out in one write (sed's buffer), so they overflow the buffer however
        // fast the reads come (line by line, a busy machine's reads could keep up).
        "while [ ! -e go ]; do sleep 0.01; done; seq 100 | sed 's/^/line /'; sleep 60",
    );
    fx.put("go", "");
    let mut dropped = 0;
    loop {
        let r = read(&fx, &noisy, 10_000);
        assert!(r.stdout.len() <= 100, "{r:?}");
        dropped += r.stdout_dropped;
        if r.stdout.ends_with("line 100\n") {
            break;
        }
    }
    assert!(dropped > 0, "1,092 bytes went through a 100-byte buffer");
    let _second = start(&fx, "sleep 60");
    let err = call(
        &fx,
        ToolName::RunCommand,
        json!({"argv": ["sleep", "60"], "background": true}),
    )
    .unwrap_err();
    assert_eq!(
        err.code(),
        monad_protocol::ErrorCode::LimitExceeded,
        "{err}"
    );
}

#[test]
fn background_processes_die_with_their_workspace() {
    let fx = Fixture::new();
    let id = start(
        &fx,
        "(setsid sh -c 'exec 9>>held.lock; flock 9; echo held > held.ready; exec sleep 60' &); \
         while [ ! -s held.ready ]; do sleep 0.01; done; echo ready; sleep 60",
    );
    read_until(&fx, &id, |s| s.contains("ready"));
    let Fixture { tmp, sandbox } = fx;
    // The workspace goes (an attached folder detaches, a session is unloaded).
    rt().block_on(async move { drop(sandbox) });
    let lock = tmp.path().join("root/held.lock");
    let free = (0..500).any(|_| {
        let file = std::fs::File::open(&lock).unwrap();
        let free =
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok();
        if !free {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        free
    });
    assert!(free, "a background process outlived its workspace");
}

#[test]
fn a_long_foreground_command_reports_its_progress() {
    let fx = Fixture::new();
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    let progress = move |line: &str| sink.lock().unwrap().push(line.to_owned());
    let out = rt()
        .block_on(fx.sandbox.call_with_progress(
            ToolName::RunCommand,
            json!({"argv": ["sh", "-c", "echo compiling step 1; sleep 3; echo finished"]}),
            Some(&progress),
        ))
        .unwrap();
    assert_eq!(out["stdout"], "compiling step 1\nfinished\n");
    let lines = lines.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("running for") && l.contains("compiling step 1")),
        "{lines:?}"
    );
}

#[test]
fn bad_process_arguments_are_refused() {
    let fx = Fixture::new();
    for (tool, args) in [
        (
            ToolName::RunCommand,
            json!({"argv": ["true"], "background": true, "background_after_ms": 5}),
        ),
        (
            ToolName::RunCommand,
            json!({"argv": ["true"], "background_after_ms": 0}),
        ),
        (ToolName::ProcessRead, json!({})),
        (ToolName::ProcessWrite, json!({"process": "p"})),
        (ToolName::ProcessKill, json!({"process": "p", "bogus": 1})),
        (ToolName::ProcessList, json!({"process": "p"})),
    ] {
        let err = call(&fx, tool, args.clone()).unwrap_err();
        assert_eq!(
            err.code(),
            monad_protocol::ErrorCode::InvalidArguments,
            "{tool} {args}: {err}"
        );
    }
}

/// Regression: a command moved to the background by `background_after_ms` was still killed at
/// the default time limit (`timed_out`, signal 9), though it was moved so as not to be.
#[test]
fn a_command_moved_to_the_background_outlives_the_default_time_limit() {
    let fx = Fixture::with_limits(Limits {
        command_default_timeout_ms: 1000,
        ..Limits::default()
    });
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({
                "argv": ["sh", "-c", "echo early; while [ ! -e go ]; do sleep 0.02; done; echo late"],
                "background_after_ms": 100,
            }),
        )
        .unwrap(),
    )
    .unwrap();
    let id = out.process.clone().expect("moved to the background");
    // Until it has run well past the default limit (or ended).
    let r = loop {
        let r = read(&fx, &id, 200);
        if !r.running || r.duration_ms > 2000 {
            break r;
        }
    };
    assert!(r.running, "killed at the default limit: {r:?}");
    fx.put("go", "");
    let (seen, r) = read_until(&fx, &id, |_| false);
    assert_eq!(
        (seen.as_str(), r.exit_code, r.timed_out),
        ("late\n", Some(0), false)
    );

    // A limit the caller gave still holds in the background.
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({
                "argv": ["sleep", "60"],
                "background_after_ms": 100,
                "timeout_ms": 1500,
            }),
        )
        .unwrap(),
    )
    .unwrap();
    let id = out.process.expect("moved to the background");
    let (_, r) = read_until(&fx, &id, |_| false);
    assert!(r.timed_out, "{r:?}");
}

/// Regression: `process_write` waited without limit for the writer of the initial `stdin`,
/// which holds the pipe until everything is written: a process that never reads hung it.
#[test]
fn process_write_behind_unread_initial_input_answers_in_bounded_time() {
    let fx = Fixture::new();
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({"argv": ["sleep", "60"], "background": true, "stdin": "x".repeat(1 << 20)}),
        )
        .unwrap(),
    )
    .unwrap();
    let id = out.process.unwrap();
    let answer = rt().block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            fx.sandbox.call(
                ToolName::ProcessWrite,
                json!({"process": id, "text": "hi\n"}),
            ),
        )
        .await
    });
    let err = answer
        .expect("process_write answered")
        .expect_err("the process does not read");
    assert_eq!(err.code(), monad_protocol::ErrorCode::Timeout, "{err}");
    call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": id, "signal": "KILL"}),
    )
    .unwrap();
}

/// A write the process stops taking midway says how much it took, in whole characters, and the
/// rest sent again completes the input with nothing twice. (The write was cancelled at its time
/// limit with whatever part the pipe had taken already written, unsaid: sending the text again
/// gave the process its first part twice.)
#[test]
fn a_write_taken_in_part_says_where_the_rest_starts() {
    let fx = Fixture::new();
    // Reads nothing for longer than a write waits, then counts what came.
    let id = start(&fx, "sleep 13; wc -c");
    // Two-byte characters: a cut between bytes would split one.
    let text = "é".repeat(100_000);
    let err = call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": id, "text": text}),
    )
    .expect_err("the pipe cannot take it all");
    assert_eq!(err.code(), monad_protocol::ErrorCode::Timeout, "{err}");
    let message = err.to_string();
    let from: usize = message
        .split("send only the text from character ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    let taken_chars = from - 1;
    assert!(
        taken_chars > 0 && taken_chars < 100_000,
        "the pipe took part of it: {message}"
    );
    assert!(
        message.contains(&format!("the first {} of 200000 bytes", taken_chars * 2)),
        "{message}"
    );
    let rest: String = text.chars().skip(taken_chars).collect();
    call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": id, "text": rest, "close_stdin": true}),
    )
    .unwrap();
    let (seen, _) = read_until(&fx, &id, |seen| seen.trim().parse::<u64>().is_ok());
    assert_eq!(seen.trim(), "200000", "every byte once");
}

/// Regression: the initial `stdin` was written by a task that took the pipe only when it first
/// ran, so a `process_write` right after the start could go first.
#[test]
fn the_initial_input_goes_before_any_process_write() {
    let fx = Fixture::new();
    // One thread, both calls in one task: the writer task cannot run in between.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen = rt.block_on(async {
        let started = fx
            .sandbox
            .call(
                ToolName::RunCommand,
                json!({"argv": ["cat"], "background": true, "stdin": "initial\n"}),
            )
            .await
            .unwrap();
        let id = started["process"].as_str().unwrap().to_owned();
        fx.sandbox
            .call(
                ToolName::ProcessWrite,
                json!({"process": id, "text": "second\n", "close_stdin": true}),
            )
            .await
            .unwrap();
        let mut seen = String::new();
        loop {
            let r = fx
                .sandbox
                .call(
                    ToolName::ProcessRead,
                    json!({"process": id, "wait_ms": 10_000}),
                )
                .await
                .unwrap();
            seen.push_str(r["stdout"].as_str().unwrap());
            if r["running"] == false {
                return seen;
            }
        }
    });
    assert_eq!(seen, "initial\nsecond\n");
}

/// Regression: a move to the background that found the table full reset the output's
/// `truncated` flags (and put back what had been taken after what came in meanwhile): the
/// command's final answer hid that its output was cut.
#[test]
fn a_move_to_a_full_table_keeps_the_foreground_answer_whole() {
    let fx = Fixture::with(
        Limits {
            output_max_bytes: 100,
            ..Limits::default()
        },
        ExecPolicy {
            max_background: 1,
            ..Default::default()
        },
    );
    let holder = start(&fx, "sleep 60");
    let out: RunCommandResult = serde_json::from_value(
        call(
            &fx,
            ToolName::RunCommand,
            json!({
                "argv": ["sh", "-c", "printf '%0200d' 0; sleep 1; echo late >&2"],
                "background_after_ms": 100,
            }),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(out.process, None, "no room: it stayed in the foreground");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "0".repeat(100));
    assert!(out.stdout_truncated, "{out:?}");
    assert_eq!(out.stderr, "late\n");
    call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": holder, "signal": "KILL"}),
    )
    .unwrap();
}

/// The host pid of the process whose command line is exactly `argv`, if one runs (a zombie
/// does not count).
fn pid_of(argv: &[&str]) -> Option<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (cmdline == want && stat_field(pid, 0).as_deref() != Some("Z")).then_some(pid)
        })
}

/// Field `n` (0 = the state) after the command name of `/proc/PID/stat`.
fn stat_field(pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(n).map(str::to_owned)
}

/// Regression: when a workspace went (its table dropped), its processes were only asked to end
/// (`KILL_TREE` to the supervisor), never forced: a supervisor stopped by another process of
/// its user never ended the tree.
#[test]
fn a_stopped_supervisor_is_killed_when_its_workspace_goes() {
    let fx = Fixture::new();
    let marker = format!("61.{}", std::process::id());
    let argv = ["sleep", marker.as_str()];
    let out = call(
        &fx,
        ToolName::RunCommand,
        json!({"argv": argv, "background": true}),
    )
    .unwrap();
    assert!(out["process"].is_string(), "{out}");
    let mut command = None;
    for _ in 0..2000 {
        command = pid_of(&argv);
        if command.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let command = command.expect("the command runs");
    // command <- init <- supervisor (namespaced), whose parent is this test process.
    let parent = |pid: i32| stat_field(pid, 1).and_then(|p| p.parse::<i32>().ok());
    let supervisor = parent(command).and_then(parent).expect("its supervisor");
    assert_eq!(parent(supervisor), Some(std::process::id() as i32));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let Fixture { tmp, sandbox } = fx;
    rt().block_on(async move { drop(sandbox) });
    let mut gone = false;
    for _ in 0..2000 {
        if pid_of(&argv).is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !gone {
        // Leave nothing behind.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(supervisor),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    drop(tmp);
    assert!(
        gone,
        "the tree of a stopped supervisor outlived its workspace"
    );
}

/// Regression: without namespaces, `end` killed a supervisor 2 s after asking it to end its
/// tree, even while it was still killing and reaping thousands of orphans: those it had not
/// reached yet lived on.
#[test]
fn a_fallback_supervisor_busy_ending_many_orphans_is_not_cut_off() {
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            namespaces: monad_sandbox::NamespacePolicy::Off,
            // Thousands of processes: more than the default process limit allows.
            max_processes: 0,
            ..Default::default()
        },
    );
    let marker = format!("77.{}", std::process::id());
    let script = format!(
        r#"
import os, time
for i in range(4000):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{marker}"])
        os._exit(0)
    os.wait()
print("made", flush=True)
time.sleep(60)
"#
    );
    let out = call(
        &fx,
        ToolName::RunCommand,
        json!({"argv": ["python3", "-c", script], "background": true}),
    )
    .unwrap();
    let id = out["process"].as_str().unwrap().to_owned();
    let (seen, r) = read_until(&fx, &id, |s| s.contains("made"));
    assert!(r.running && seen.contains("made"), "{seen} {r:?}");
    let count = || {
        let want = format!("sleep\0{marker}\0");
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                    return false;
                };
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes())
                    && stat_field(pid, 0).as_deref() != Some("Z")
            })
            .count()
    };
    assert_eq!(count(), 4000);
    let Fixture { tmp, sandbox } = fx;
    let started = std::time::Instant::now();
    rt().block_on(async move { drop(sandbox) });
    let mut left = count();
    while left > 0 && started.elapsed() < std::time::Duration::from_secs(90) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = count();
        if now == left && started.elapsed() > std::time::Duration::from_secs(15) {
            break;
        }
        left = now;
    }
    eprintln!("orphans left {left} after {:?}", started.elapsed());
    drop(tmp);
    assert_eq!(left, 0, "orphans outlived their workspace");
}

/// Regression: `Sandbox::check` (what runs before anyone is asked to approve) passed calls the
/// run then refused: `background` with `background_after_ms`, `background_after_ms: 0`, a
/// background command when the table is full, and `process_write` / `process_kill` on a
/// process that exited or whose input is closed. The check and the run now agree.
#[test]
fn calls_the_run_would_refuse_fail_the_check_with_the_same_code() {
    use monad_protocol::ErrorCode::{InvalidArguments, LimitExceeded};
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            max_background: 2,
            ..Default::default()
        },
    );
    let check = |tool, args: Value| fx.sandbox.check(tool, &args).err().map(|e| e.code());
    let run = |tool, args: Value| call(&fx, tool, args).err().map(|e| e.code());
    for args in [
        json!({"argv": ["true"], "background": true, "background_after_ms": 5}),
        json!({"argv": ["true"], "background_after_ms": 0}),
    ] {
        assert_eq!(
            check(ToolName::RunCommand, args.clone()),
            Some(InvalidArguments),
            "{args}"
        );
        assert_eq!(
            run(ToolName::RunCommand, args.clone()),
            Some(InvalidArguments),
            "{args}"
        );
    }
    let reading = start(&fx, "cat >/dev/null; sleep 60");
    let exited = start(&fx, "exit 0");
    // Waits for it to exit without reading it (a read that sees the end removes it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while serde_json::from_value::<ProcessListResult>(
        call(&fx, ToolName::ProcessList, json!({})).unwrap(),
    )
    .unwrap()
    .processes
    .iter()
    .any(|p| p.process == exited && p.running)
    {
        assert!(std::time::Instant::now() < deadline, "`exit 0` still runs");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The table is full: a background command cannot start (one that may move still can: it
    // stays in the foreground).
    let background = json!({"argv": ["true"], "background": true});
    assert_eq!(
        check(ToolName::RunCommand, background.clone()),
        Some(LimitExceeded)
    );
    assert_eq!(run(ToolName::RunCommand, background), Some(LimitExceeded));
    assert_eq!(
        check(
            ToolName::RunCommand,
            json!({"argv": ["true"], "background_after_ms": 5})
        ),
        None
    );
    // An exited process takes no input and no signal.
    for (tool, args) in [
        (
            ToolName::ProcessWrite,
            json!({"process": exited, "text": "x"}),
        ),
        (ToolName::ProcessKill, json!({"process": exited})),
    ] {
        assert_eq!(check(tool, args.clone()), Some(InvalidArguments), "{tool}");
        assert_eq!(run(tool, args.clone()), Some(InvalidArguments), "{tool}");
    }
    // Closed input takes no more.
    call(
        &fx,
        ToolName::ProcessWrite,
        json!({"process": reading, "text": "", "close_stdin": true}),
    )
    .unwrap();
    let more = json!({"process": reading, "text": "x"});
    assert_eq!(
        check(ToolName::ProcessWrite, more.clone()),
        Some(InvalidArguments)
    );
    assert_eq!(run(ToolName::ProcessWrite, more), Some(InvalidArguments));
    // What can run passes.
    assert_eq!(
        check(ToolName::ProcessKill, json!({"process": reading})),
        None
    );
    assert_eq!(
        check(ToolName::ProcessRead, json!({"process": exited})),
        None
    );
    call(
        &fx,
        ToolName::ProcessKill,
        json!({"process": reading, "signal": "KILL"}),
    )
    .unwrap();
}
