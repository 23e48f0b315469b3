//! Background processes and commands' network over real QUIC: a process started in an attached
//! folder or in the primary workspace is found again by its id alone, read while it runs,
//! written to and killed; it ends with its workspace; a long foreground command reports its
//! progress to the agent; the connections a command asks for land in the audit log.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use monad_client::approval::{Approver, Decision, ScriptedApprover};
use monad_protocol::{ErrorCode, ToolClass, ToolName};
use monad_sandbox::NetworkMode;
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, call, call_in, expect_code, folder, ok, within,
};
use serde_json::{Value, json};

/// Reads process `id` (routed by its id alone) until its output holds `want` or it ends;
/// returns everything read and the last answer.
async fn read_until(agent: &monad_client::agent::Agent, id: &str, want: &str) -> (String, Value) {
    let mut seen = String::new();
    within(STEP, &format!("`{want}` from process {id}"), async {
        loop {
            let (r, _) = ok(call(
                agent,
                "process_read",
                json!({"process": id, "wait_ms": 5000}),
            )
            .await);
            seen.push_str(r["stdout"].as_str().unwrap_or_default());
            if seen.contains(want) || r["running"] == false {
                return (seen.clone(), r);
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_in_an_attached_folder_is_found_by_its_id_alone() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    let attached = Attachment::start(&server.client_config(), options, None).await;

    let (started, ran_in) = ok(call(
        &agent,
        "run_command",
        json!({
            "argv": ["sh", "-c", "echo building; while read x; do echo \"step $x\"; done; echo built"],
            "background": true,
            "workspace": "lap",
        }),
    )
    .await);
    assert_eq!(ran_in, "lap");
    let id = started["process"]
        .as_str()
        .expect("a process id")
        .to_owned();
    let (seen, r) = read_until(&agent, &id, "building").await;
    assert_eq!((seen.as_str(), &r["running"]), ("building\n", &json!(true)));
    // No `workspace` in any of these: the session knows where the process runs.
    let reply = call(
        &agent,
        "process_write",
        json!({"process": id, "text": "1\n"}),
    )
    .await;
    assert_eq!(ok(reply).1, "lap");
    read_until(&agent, &id, "step 1").await;
    let (listed, ran_in) = ok(call(&agent, "process_list", json!({})).await);
    assert_eq!(ran_in, "lap");
    assert_eq!(listed["processes"][0]["process"], json!(id));
    ok(call(
        &agent,
        "process_write",
        json!({"process": id, "text": "", "close_stdin": true}),
    )
    .await);
    let (seen, r) = read_until(&agent, &id, "built").await;
    assert!(seen.ends_with("built\n"), "{seen}");
    if r["running"] == true {
        let (_, r) = read_until(&agent, &id, "\u{0}never").await;
        assert_eq!(r["exit_code"], 0, "{r}");
    }
    // Read to its end, a read again still finds it, and says how it ended; an unknown id is
    // refused before reaching any workspace.
    let (again, ran_in) = ok(call(&agent, "process_read", json!({"process": id})).await);
    assert_eq!(ran_in, "lap");
    assert_eq!(
        (&again["running"], &again["exit_code"]),
        (&json!(false), &json!(0))
    );
    expect_code(
        call(&agent, "process_read", json!({"process": "proc-00000000"})).await,
        ErrorCode::NotFound,
    );

    // Everything it started ends when the folder is detached.
    let (started, _) = ok(call(
        &agent,
        "run_command",
        json!({
            "argv": ["sh", "-c", "(setsid sh -c 'exec 9>>held.lock; flock 9; echo held > held.ready; \
                     exec sleep 60' &); while [ ! -s held.ready ]; do sleep 0.01; done; echo ready; sleep 60"],
            "background": true,
            "workspace": "lap",
        }),
    )
    .await);
    let id = started["process"].as_str().unwrap().to_owned();
    read_until(&agent, &id, "ready").await;
    drop(attached);
    let lock = laptop.path().join("held.lock");
    within(STEP, "the detached folder's processes to end", async {
        loop {
            let file = std::fs::File::open(&lock).unwrap();
            if nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Regression: `process_list` without a workspace listed only the workspace of the most recent
/// background process, and failed when that folder was offline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_list_without_a_workspace_lists_every_workspace_and_reports_an_offline_one() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    let attached = Attachment::start(&server.client_config(), options, None).await;
    let start = |workspace: &'static str| {
        let agent = &agent;
        async move {
            let (started, ran_in) = ok(call(
                agent,
                "run_command",
                json!({"argv": ["sleep", "60"], "background": true, "workspace": workspace}),
            )
            .await);
            assert_eq!(ran_in, workspace);
            started["process"]
                .as_str()
                .expect("a process id")
                .to_owned()
        }
    };
    // None started yet: the session says so itself, not one workspace for itself alone (it
    // said "No background processes in workspace primary.").
    let (listed, ran_in) = ok(call(&agent, "process_list", json!({})).await);
    assert_eq!(listed, json!({"processes": []}));
    assert_eq!(ran_in, "");
    assert_eq!(
        monad_protocol::render::text(ToolName::ProcessList, None, &listed),
        "No background processes."
    );
    expect_code(
        call(&agent, "process_list", json!({"bogus": true})).await,
        ErrorCode::InvalidArguments,
    );
    // A wrong argument is said as such, before the unknown process is.
    let said = expect_code(
        call(
            &agent,
            "process_read",
            json!({"process": "p999", "last_lines": -1}),
        )
        .await,
        ErrorCode::InvalidArguments,
    );
    assert!(said.contains("`last_lines`"), "{said}");
    let here = start("primary").await;
    let there = start("lap").await;
    // The list covers two workspaces: it names no one workspace as the one that ran it.
    let (listed, ran_in) = ok(call(&agent, "process_list", json!({})).await);
    assert_eq!(ran_in, "", "{listed}");
    let found: Vec<(Value, Value)> = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["process"].clone(), p["workspace"].clone()))
        .collect();
    assert_eq!(
        found,
        vec![
            (json!(here), json!("primary")),
            (json!(there), json!("lap"))
        ],
        "{listed}"
    );
    assert!(listed.get("unavailable").is_none(), "{listed}");

    drop(attached);
    within(STEP, "the folder to go offline", async {
        loop {
            let (workspaces, _) = ok(call(&agent, "workspaces", json!({})).await);
            let online = workspaces["workspaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["name"] == "lap" && w["online"] == true);
            if !online {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (listed, _) = ok(call(&agent, "process_list", json!({})).await);
    assert_eq!(listed["processes"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["processes"][0]["process"], json!(here), "{listed}");
    assert_eq!(listed["unavailable"][0]["workspace"], "lap", "{listed}");
    assert_eq!(
        listed["unavailable"][0]["code"], "workspace_disconnected",
        "{listed}"
    );
    ok(call(
        &agent,
        "process_kill",
        json!({"process": here, "signal": "KILL"}),
    )
    .await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_in_the_primary_runs_across_calls() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let (started, ran_in) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.2; done"], "background": true}),
    )
    .await);
    assert_eq!(ran_in, "primary");
    let id = started["process"].as_str().unwrap().to_owned();
    let (seen, _) = read_until(&agent, &id, "tick 3").await;
    assert_eq!(seen, "tick 1\ntick 2\ntick 3\n");
    let (_, r) = read_until(&agent, &id, "\u{0}never").await;
    assert_eq!(
        (r["running"].clone(), r["exit_code"].clone()),
        (json!(false), json!(0))
    );
    // A process of another workspace is not found by naming the wrong one.
    let (started, _) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["sleep", "30"], "background": true}),
    )
    .await);
    let id = started["process"].as_str().unwrap().to_owned();
    let (killed, _) = ok(call(
        &agent,
        "process_kill",
        json!({"process": id, "signal": "KILL"}),
    )
    .await);
    assert_eq!(killed["delivered"], true);
    let (_, r) = read_until(&agent, &id, "\u{0}never").await;
    assert_eq!(r["signal"], 9, "{r}");
}

/// An agent that read a background process's output (a build's error scrolled past) reads its
/// last lines again, in an attached folder and in the primary: until then `process_read` only
/// ever gave what was new, and what an earlier read returned was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reads_a_background_processs_last_lines_again_in_either_workspace() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let script = "i=1; while [ $i -le 40 ]; do echo line $i; i=$((i+1)); done; \
                  echo oops >&2; echo printed; read x; echo more; read y";
    for workspace in ["lap", "primary"] {
        let (started, ran_in) = ok(call(
            &agent,
            "run_command",
            json!({"argv": ["sh", "-c", script], "background": true, "workspace": workspace}),
        )
        .await);
        assert_eq!(ran_in, workspace);
        let id = started["process"].as_str().unwrap().to_owned();
        let (seen, _) = read_until(&agent, &id, "printed").await;
        assert!(
            seen.starts_with("line 1\n") && seen.ends_with("printed\n"),
            "{seen}"
        );
        // Everything was read: nothing is new, yet the last lines are still there.
        let (again, ran_in) = ok(call(
            &agent,
            "process_read",
            json!({"process": id, "last_lines": 3}),
        )
        .await);
        assert_eq!(ran_in, workspace);
        assert_eq!(again["stdout"], "line 39\nline 40\nprinted\n", "{again}");
        assert_eq!(again["stderr"], "oops\n", "{again}");
        assert_eq!(
            (&again["last_lines"], &again["running"]),
            (&json!(3), &json!(true))
        );
        // What is kept for that is not counted as unread.
        let (listed, _) = ok(call(&agent, "process_list", json!({"workspace": workspace})).await);
        assert_eq!(listed["processes"][0]["unread_bytes"], 0, "{listed}");
        // New output comes with them, and is read by it.
        ok(call(
            &agent,
            "process_write",
            json!({"process": id, "text": "go\n"}),
        )
        .await);
        let (again, _) = within(STEP, "`more` among the last lines", async {
            loop {
                let r = ok(call(
                    &agent,
                    "process_read",
                    json!({"process": id, "last_lines": 2, "wait_ms": 5000}),
                )
                .await);
                if r.0["stdout"].as_str().unwrap_or_default().contains("more") {
                    return r;
                }
            }
        })
        .await;
        assert_eq!(again["stdout"], "printed\nmore\n", "{again}");
        let (next, _) = ok(call(&agent, "process_read", json!({"process": id})).await);
        assert_eq!(
            (&next["stdout"], &next["running"]),
            (&json!(""), &json!(true)),
            "read by the call that showed it: {next}"
        );
        // Zero lines is no request at all.
        expect_code(
            call(
                &agent,
                "process_read",
                json!({"process": id, "last_lines": 0}),
            )
            .await,
            ErrorCode::InvalidArguments,
        );
        ok(call(
            &agent,
            "process_kill",
            json!({"process": id, "signal": "KILL"}),
        )
        .await);
        let (_, r) = read_until(&agent, &id, "\u{0}never").await;
        assert_eq!(r["signal"], 9, "{r}");
        // Read to its end, it still shows its last lines, and the session still knows where.
        let (after, ran_in) = ok(call(
            &agent,
            "process_read",
            json!({"process": id, "last_lines": 1}),
        )
        .await);
        assert_eq!(ran_in, workspace);
        assert_eq!(
            (&after["stdout"], &after["running"], &after["signal"]),
            (&json!("more\n"), &json!(false), &json!(9)),
            "{after}"
        );
        // It is not listed any more: no workspace is asked for it.
        let (listed, _) = ok(call(&agent, "process_list", json!({})).await);
        assert_eq!(listed["processes"], json!([]), "{listed}");
    }
}

/// A background process that has exited keeps its session in memory until its output is read:
/// a session was unloaded as soon as none of its processes ran, and the output and exit status
/// of a finished build were lost (`process_read` then said the session had no such process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_background_process_keeps_its_output_until_it_is_read() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let (started, _) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["sh", "-c", "echo BUILD-RESULT-42; exit 7"], "background": true}),
    )
    .await);
    let id = started["process"].as_str().unwrap().to_owned();
    // Until it has exited (listing does not read its output).
    within(STEP, "the process to exit", async {
        loop {
            let (listed, _) = ok(call(&agent, "process_list", json!({})).await);
            if listed["processes"][0]["running"] == false {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    // Idle sessions are unloaded (as `idle_unload_hours` or the memory bound would): not this.
    server
        .state()
        .registry
        .unload_idle(std::time::Duration::ZERO);
    let (read, _) = ok(call(&agent, "process_read", json!({"process": id})).await);
    assert!(
        read["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("BUILD-RESULT-42"),
        "{read}"
    );
    assert_eq!(read["exit_code"], 7, "{read}");
    // Read to its end, it still tells how it ended; that does not keep the session, which may
    // go now, and the process with it.
    let (again, _) = ok(call(
        &agent,
        "process_read",
        json!({"process": id, "last_lines": 1}),
    )
    .await);
    assert_eq!(
        (&again["stdout"], &again["exit_code"]),
        (&json!("BUILD-RESULT-42\n"), &json!(7))
    );
    server
        .state()
        .registry
        .unload_idle(std::time::Duration::ZERO);
    expect_code(
        call(&agent, "process_read", json!({"process": id})).await,
        ErrorCode::NotFound,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_command_reports_progress_to_the_agent_from_either_workspace() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Exec];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    for workspace in ["primary", "lap"] {
        let mut lines = Vec::new();
        let reply = agent
            .call(
                None,
                "run_command",
                json!({"argv": ["sh", "-c", "echo compiling crate one; sleep 3; echo done"], "workspace": workspace}),
                |line| lines.push(line.to_owned()),
            )
            .await
            .expect("answered");
        let (result, _) = ok(reply);
        assert_eq!(result["stdout"], "compiling crate one\ndone\n");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("running for") && l.contains("compiling crate one")),
            "{workspace}: {lines:?}"
        );
    }
}

/// Answers `ok` to any HTTP request on 127.0.0.1; returns the port.
fn http_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    port
}

/// Whether audit line `line` is about a connection to `port`.
fn mentions(line: &Value, port: u16) -> bool {
    line["target"]
        .as_str()
        .is_some_and(|t| t.contains(&format!(":{port}")))
}

/// The `network` lines of the default session's audit log, once there is one for each of
/// `ports` (the primary workspace's connections reach the log as they happen).
async fn network_lines(server: &TestServer, ports: &[u16]) -> Vec<Value> {
    within(STEP, &format!("audit lines for ports {ports:?}"), async {
        loop {
            if let Some(recorder) = &server.state().executor.recorder {
                recorder.flush();
            }
            let log =
                std::fs::read_to_string(server.data_dir().join("sessions/default/audit.jsonl"))
                    .unwrap_or_default();
            let network: Vec<Value> = log
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|l| l["tool"] == "network")
                .collect();
            if ports
                .iter()
                .all(|&port| network.iter().any(|l| mentions(l, port)))
            {
                return network;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Regression: a connection reached the audit log only with a later answer that carried it, so
/// one asked for by a background command nobody read (or by a cancelled call, or one whose
/// answer timed out) was never recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_of_a_background_command_nobody_reads_is_in_the_audit_log() {
    let unlisted = http_server();
    let server = TestServer::start_with(|config| {
        config.exec.network = NetworkMode::Allowlist;
        config.exec.allow = vec!["192.0.2.1:80".into()];
    })
    .await;
    let agent = server.agent().await;
    let script = format!(
        "curl -sS --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{unlisted}/; sleep 60"
    );
    let (started, _) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["sh", "-c", script], "background": true}),
    )
    .await);
    assert!(started["process"].is_string(), "{started}");
    // Never read: the line comes anyway.
    let network = network_lines(&server, &[unlisted]).await;
    let line = network.iter().find(|l| mentions(l, unlisted)).unwrap();
    assert_eq!(line["decision"], "denied", "{line}");
    assert_eq!(line["decided_by"], "network_policy", "{line}");
    assert_eq!(line["workspace"], "primary", "{line}");
}

/// Regression: an attached folder's connections reached the audit log only with a result that
/// carried them; its client now reports them on the attach stream as they happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_of_an_attached_folders_background_command_nobody_reads_is_in_the_audit_log() {
    let unlisted = http_server();
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    options.exec.network = NetworkMode::Allowlist;
    options.exec.allow = vec!["192.0.2.1:80".into()];
    let mut attached = Attachment::start(&server.client_config(), options, None).await;
    let script = format!(
        "curl -sS --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{unlisted}/; sleep 60"
    );
    let (started, _) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["sh", "-c", script], "background": true, "workspace": "lap"}),
    )
    .await);
    assert!(started["process"].is_string(), "{started}");
    let network = network_lines(&server, &[unlisted]).await;
    let lines: Vec<&Value> = network.iter().filter(|l| mentions(l, unlisted)).collect();
    assert_eq!(lines[0]["decision"], "denied", "{lines:?}");
    assert_eq!(lines[0]["decided_by"], "network_policy", "{lines:?}");
    assert_eq!(lines[0]["workspace"], "lap", "{lines:?}");
    // The folder's owner is told too, on the attach terminal.
    let refused = loop {
        if let monad_client::attach::AttachEvent::NetworkRefused(refused) =
            attached.next_event().await
        {
            break refused;
        }
    };
    assert!(
        refused.first.starts_with(&format!("127.0.0.1:{unlisted}")),
        "{refused:?}"
    );
    let line = monad_client::attach::AttachEvent::NetworkRefused(refused)
        .line()
        .unwrap();
    assert!(
        line.starts_with("network: the folder's policy refused a command's connection to"),
        "{line}"
    );
    // Read now: the answer carries it too, and it is not recorded again.
    let (read, _) = ok(call(
        &agent,
        "process_read",
        json!({"process": started["process"]}),
    )
    .await);
    let carried = read["network"]
        .as_array()
        .expect("connections in the answer");
    assert!(
        carried.iter().any(|e| e["port"] == json!(unlisted)),
        "{read}"
    );
    if let Some(recorder) = &server.state().executor.recorder {
        recorder.flush();
    }
    let again = network_lines(&server, &[unlisted]).await;
    assert_eq!(
        again.iter().filter(|l| mentions(l, unlisted)).count(),
        1,
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_a_command_asks_for_are_in_the_audit_log() {
    let listed = http_server();
    let unlisted = http_server();
    let server = TestServer::start_with(|config| {
        config.exec.network = NetworkMode::Allowlist;
        config.exec.allow = vec![format!("127.0.0.1:{listed}")];
    })
    .await;
    let agent = server.agent().await;
    let script = format!(
        "curl -sS --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{listed}/; echo; \
         curl -sS --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{unlisted}/ || true"
    );
    let (result, _) = ok(call(&agent, "run_command", json!({"argv": ["sh", "-c", script]})).await);
    assert!(
        result["stdout"].as_str().unwrap().starts_with("ok\n"),
        "{result}"
    );
    let network = network_lines(&server, &[listed, unlisted]).await;
    let line = |port: u16| {
        network
            .iter()
            .find(|l| mentions(l, port))
            .unwrap_or_else(|| panic!("no audit line for port {port}: {network:?}"))
            .clone()
    };
    assert_eq!(line(listed)["decision"], "allowed");
    assert_eq!(line(unlisted)["decision"], "denied");
    assert_eq!(line(unlisted)["decided_by"], "network_policy");
    assert!(
        line(unlisted)["target"]
            .as_str()
            .unwrap()
            .contains("not in the allowlist"),
        "{network:?}"
    );
}

/// What a command reached before (run as root, on the server): the server's own listeners on its
/// loopback. With the network off, the primary workspace's commands have a loopback of their
/// own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_reach_the_servers_own_loopback() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| c.http = Some(http)).await;
    let agent = server.agent().await;
    // The server answers on its loopback (401 without a token)...
    let direct = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://{http}/mcp"),
        ])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&direct.stdout), "401");
    // ...which its commands do not see.
    let (result, ran_in) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["curl", "-sS", "--max-time", "5", format!("http://{http}/mcp")]}),
    )
    .await);
    assert_eq!(ran_in, "primary");
    assert_ne!(result["exit_code"], 0, "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("Couldn't connect"),
        "{result}"
    );
    // Nor the QUIC endpoint (UDP on the same loopback address).
    let quic = server.addr;
    let (result, _) = ok(call(
        &agent,
        "run_command",
        json!({"argv": ["python3", "-c", format!(
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.settimeout(2); s.connect(('127.0.0.1', {})); s.send(b'x'); \
             print(s.recv(10))", quic.port())]}),
    )
    .await);
    assert_ne!(result["exit_code"], 0, "{result}");
}

/// Regression: process calls that could not run were still put to the laptop's user, and only
/// failed (`invalid_arguments`, `limit_exceeded`) after they said yes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_calls_that_cannot_run_are_not_put_to_the_user() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    // Reads are pre-approved; the three calls that set the scene are allowed; anything asked
    // after them is denied.
    let approver = Arc::new(ScriptedApprover::new([
        Some(Decision::AllowOnce),
        Some(Decision::AllowOnce),
        Some(Decision::AllowOnce),
    ]));
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read];
    options.exec.max_background = 2;
    let _attached = Attachment::start(
        &server.client_config(),
        options,
        Some(approver.clone() as Arc<dyn Approver>),
    )
    .await;
    let start = |script: &'static str| {
        let agent = &agent;
        async move {
            let (started, _) = ok(call(
                agent,
                "run_command",
                json!({"argv": ["sh", "-c", script], "background": true, "workspace": "lap"}),
            )
            .await);
            started["process"]
                .as_str()
                .expect("a process id")
                .to_owned()
        }
    };
    let reading = start("cat >/dev/null; sleep 60").await;
    let exited = start("exit 0").await;
    // Waits for it to exit without reading it (a read that sees the end removes it).
    within(STEP, "the second process to exit", async {
        loop {
            let (listed, _) = ok(call(&agent, "process_list", json!({"workspace": "lap"})).await);
            let running = listed["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["process"] == json!(exited) && p["running"] == true);
            if !running {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    ok(call(
        &agent,
        "process_write",
        json!({"process": reading, "text": "", "close_stdin": true}),
    )
    .await);
    let asked = approver.seen().len();
    let cases: Vec<(&str, Value, ErrorCode)> = vec![
        (
            "run_command",
            json!({"argv": ["true"], "background": true, "background_after_ms": 5}),
            ErrorCode::InvalidArguments,
        ),
        (
            "run_command",
            json!({"argv": ["true"], "background_after_ms": 0}),
            ErrorCode::InvalidArguments,
        ),
        (
            "run_command",
            json!({"argv": ["true"], "background": true}),
            ErrorCode::LimitExceeded,
        ),
        (
            "process_write",
            json!({"process": exited, "text": "x"}),
            ErrorCode::InvalidArguments,
        ),
        (
            "process_kill",
            json!({"process": exited}),
            ErrorCode::InvalidArguments,
        ),
        (
            "process_write",
            json!({"process": reading, "text": "x"}),
            ErrorCode::InvalidArguments,
        ),
    ];
    for (tool, mut args, code) in cases {
        args.as_object_mut()
            .unwrap()
            .insert("workspace".into(), "lap".into());
        let shown = args.to_string();
        let error = monad_tests::err(call(&agent, tool, args).await);
        assert_eq!(error.code, code, "{tool} {shown}: {error}");
        assert_eq!(
            approver.seen().len(),
            asked,
            "{tool} {shown} was put to the user"
        );
    }
}

/// A folder attached (commands pre-approved, `max_background` processes at most) into a first
/// session, then shared into a second one (`sessions --new` in it, and a landing there).
struct Shared {
    _server: TestServer,
    agent: monad_client::agent::Agent,
    _folder: tempfile::TempDir,
    _attached: Attachment,
    first: String,
    second: String,
}

async fn shared_folder(max_background: usize) -> Shared {
    let server = TestServer::start().await;
    let config = server.client_config();
    let agent = monad_tests::connect_agent(&config).await;
    let project = folder(&[]);
    let dir = project.path().canonicalize().expect("canonical");
    let first = within(STEP, "a session", agent.open_session(None))
        .await
        .expect("a session")
        .id;
    let mut options = attach_options(&dir, "proj");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    options.session = Some(first.clone());
    options.exec.max_background = max_background;
    let attached = Attachment::start(&config, options, None).await;
    let second = within(
        STEP,
        "sessions --new in the folder",
        agent.open_session_in(None, dir.to_str()),
    )
    .await
    .expect("a new session")
    .id;
    let uri = format!("file://{}", dir.display());
    let landed = within(STEP, "land", agent.land(vec![uri], None))
        .await
        .expect("lands")
        .expect("lands by roots");
    assert_eq!(landed.session, second);
    let (_, listed) = within(STEP, "workspaces", agent.workspaces(Some(&second)))
        .await
        .expect("the new session");
    assert!(listed.iter().any(|w| w.name == "proj"), "{listed:?}");
    Shared {
        _server: server,
        agent,
        _folder: project,
        _attached: attached,
        first,
        second,
    }
}

/// One folder of a user's serves every session of theirs it is shared into (an MCP host's
/// landing, `sessions --new`), with one process table: a session's process tools see and reach
/// only the processes it started. Another's read as not there, before anyone is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_shared_into_another_session_keeps_each_sessions_processes_its_own() {
    let shared = shared_folder(16).await;
    let (agent, first, second) = (&shared.agent, &shared.first, &shared.second);
    let (started, _) = ok(call_in(
        agent,
        Some(first),
        "run_command",
        json!({"argv": ["sh", "-c", "echo secret; read x; echo \"got $x\"; sleep 600"],
               "background": true, "workspace": "proj"}),
    )
    .await);
    let id = started["process"]
        .as_str()
        .expect("a process id")
        .to_owned();

    assert!(listed_in(agent, second).await.is_empty());
    for (tool, args) in [
        ("process_read", json!({"process": id, "workspace": "proj"})),
        (
            "process_write",
            json!({"process": id, "text": "stolen\n", "workspace": "proj"}),
        ),
        ("process_kill", json!({"process": id, "workspace": "proj"})),
        // Named by its id alone, as an agent would.
        ("process_read", json!({"process": id})),
    ] {
        let said = expect_code(
            call_in(agent, Some(second), tool, args.clone()).await,
            ErrorCode::NotFound,
        );
        assert!(said.contains("no background process"), "{tool}: {said}");
    }
    // Its own process, in the same folder, is its own; the first session does not see it.
    let (own, _) = ok(call_in(
        agent,
        Some(second),
        "run_command",
        json!({"argv": ["sleep", "600"], "background": true, "workspace": "proj"}),
    )
    .await);
    let own = own["process"].as_str().expect("an id").to_owned();
    assert_eq!(listed_in(agent, second).await, [own]);

    // The first session's process still runs, its output and its input untouched.
    assert_eq!(listed_in(agent, first).await, std::slice::from_ref(&id));
    ok(call_in(
        agent,
        Some(first),
        "process_write",
        json!({"process": id, "text": "mine\n", "workspace": "proj"}),
    )
    .await);
    let (seen, last) = read_in(agent, first, &id, Some("got mine")).await;
    assert_eq!(last["running"], true, "{last}");
    assert_eq!(seen, "secret\ngot mine\n");
}

/// A session sees only its own processes in a shared folder, whose table is one: when other
/// sessions' processes fill it, a start is refused saying so (they are freed by those sessions,
/// never let go unread), and one read to its end makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_shared_folder_table_says_which_places_other_sessions_hold() {
    let shared = shared_folder(2).await;
    let (agent, first, second) = (&shared.agent, &shared.first, &shared.second);
    async fn start_in(
        agent: &monad_client::agent::Agent,
        session: &str,
        argv: Value,
    ) -> monad_client::agent::CallReply {
        call_in(
            agent,
            Some(session),
            "run_command",
            json!({"argv": argv, "background": true, "workspace": "proj"}),
        )
        .await
    }
    let start = |session, argv| start_in(agent, session, argv);
    let mut theirs = Vec::new();
    for n in 0..2 {
        let (started, _) = ok(start(second, json!(["echo", format!("done-{n}")])).await);
        theirs.push(started["process"].as_str().expect("an id").to_owned());
    }
    let refused = expect_code(
        start(first, json!(["sleep", "600"])).await,
        ErrorCode::LimitExceeded,
    );
    assert!(
        refused.contains("2 of them are other sessions' of this folder"),
        "{refused}"
    );
    // Nothing of the second's was let go: both are read whole, the first to its end.
    let (read, _) = read_in(agent, second, &theirs[0], None).await;
    assert_eq!(read, "done-0\n");
    let (mine, _) = ok(start(first, json!(["sleep", "600"])).await);
    assert!(mine["process"].is_string(), "{mine}");
    let (read, _) = read_in(agent, second, &theirs[1], None).await;
    assert_eq!(read, "done-1\n");
}

/// The ids `process_list` gives `session` in the shared folder.
async fn listed_in(agent: &monad_client::agent::Agent, session: &str) -> Vec<String> {
    let (list, _) = ok(call_in(
        agent,
        Some(session),
        "process_list",
        json!({"workspace": "proj"}),
    )
    .await);
    list["processes"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|p| p["process"].as_str().map(str::to_owned))
        .collect()
}

/// Reads process `id` of the shared folder, in `session`, until its output holds `want` (or,
/// without one, until it ends): all it printed, and the last answer.
async fn read_in(
    agent: &monad_client::agent::Agent,
    session: &str,
    id: &str,
    want: Option<&str>,
) -> (String, Value) {
    let mut seen = String::new();
    within(STEP, &format!("process {id}'s output"), async {
        loop {
            let (r, _) = ok(call_in(
                agent,
                Some(session),
                "process_read",
                json!({"process": id, "wait_ms": 2000, "workspace": "proj"}),
            )
            .await);
            seen.push_str(r["stdout"].as_str().unwrap_or_default());
            if want.is_some_and(|w| seen.contains(w)) || r["running"] == false {
                return (seen.clone(), r);
            }
        }
    })
    .await
}
