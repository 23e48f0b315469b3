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
    // Read to the end: it is gone.
    let err = call(&fx, ToolName::ProcessRead, json!({"process": id})).unwrap_err();
    assert_eq!(err.code(), monad_protocol::ErrorCode::NotFound, "{err}");
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
                "argv": ["sh", "-c", "echo early; while [ ! -e go ]; do sleep 0.02; done; echo late"],
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
    let (seen, r) = read_until(&fx, &id, |_| false);
    assert_eq!(seen, "late\n");
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
