//! Several hosts on one PostgreSQL + S3 store, as real processes: `serve --store/--objects`, and
//! a laptop whose host is killed re-attaching through another host of its config, with the
//! session's history, audit records and artifacts all readable there.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use monad_client::config::ClientConfig;
use monad_tests::{
    STEP, ServerProcess, call_in, command, connect_agent, folder, ok, wait_for_line, within,
};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use super::pg_store::Pg;

/// The session the laptop and the agents share.
const SESSION: &str = "0f5ad1e2-7c3b-4e8a-9d61-2b4c6e8fa013";

/// Copies the certificate and key (`tls/`) of the host at `from` into the data dir `to`, before
/// its host first starts: the hosts of one deployment present one certificate, so one pinned
/// fingerprint trusts them all.
fn share_tls(from: &Path, to: &Path) {
    let tls = to.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    for file in ["cert.pem", "key.pem"] {
        std::fs::copy(from.join("tls").join(file), tls.join(file)).unwrap();
    }
}

/// `GET path` on the HTTP API at `http` with `token`: the JSON answer of a `200`.
async fn get(http: SocketAddr, token: &str, path: &str) -> Value {
    let answer = within(STEP, path, async {
        super::web::http_client()
            .get(format!("http://{http}{path}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(answer.status(), 200, "{path}");
    within(STEP, path, answer.json()).await.unwrap()
}

/// The raw body of `GET path` (an artifact's payload).
async fn get_bytes(http: SocketAddr, token: &str, path: &str) -> Vec<u8> {
    let answer = within(STEP, path, async {
        super::web::http_client()
            .get(format!("http://{http}{path}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(answer.status(), 200, "{path}");
    within(STEP, path, answer.bytes()).await.unwrap().to_vec()
}

/// The ids of `list[key]`'s entries, by `id`.
fn ids(list: &Value, key: &str, id: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no `{key}` in {list}"))
        .iter()
        .map(|e| e[id].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_store_and_objects_flags_beat_the_config_file_and_the_environment() {
    let test = "serve_store_and_objects_flags_beat_the_config_file_and_the_environment";
    let Some(pg) = Pg::with_s3(test) else {
        return;
    };
    let bucket = pg.objects.clone().expect("a bucket");
    // The file and the environment name a store that does not exist: only the flags work.
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("config.toml"),
        "[store]\nurl = \"postgres://nobody@127.0.0.1:1/none\"\nobjects = \"s3://from-the-file\"\n\
         connect_timeout_secs = 2\n",
    )
    .unwrap();
    let mut env: Vec<(&str, &str)> = bucket
        .vars
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    env.push(("MONAD_STORE_URL", "postgres://nobody@127.0.0.1:1/env"));
    env.push(("MONAD_STORE_OBJECTS", "s3://from-the-environment"));
    let flags = ["--store", pg.url.as_str(), "--objects", bucket.url.as_str()];
    let server = ServerProcess::start_args(data.path(), &env, None, &flags).await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    ok(call_in(
        &agent,
        Some(SESSION),
        "write_file",
        json!({"path": "a.txt", "content": "kept in the shared store\n"}),
    )
    .await);
    drop(agent);
    server.stop().await;
    // The artifact content is in the bucket, and the rows in PostgreSQL: another host on the
    // same flags (and nothing else) serves the session and takes the same token.
    within(STEP, "the artifact content in the bucket", async {
        loop {
            let keys = pg.object_keys().expect("a bucket");
            if keys.iter().any(|k| k.starts_with(&format!("{SESSION}/"))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let other = tempfile::tempdir().unwrap();
    let bucket_env: Vec<(&str, &str)> = bucket
        .vars
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let second = ServerProcess::start_args(other.path(), &bucket_env, None, &flags).await;
    assert_eq!(second.first_token, None, "the tokens are in PostgreSQL");
    let agent = connect_agent(&second.client_config(&token)).await;
    let listed = within(STEP, "sessions", agent.sessions()).await.unwrap();
    assert!(listed.iter().any(|s| s.id == SESSION), "{listed:?}");
    drop(agent);
    second.stop().await;

    // A bad value is a clear error, and nothing starts.
    for (args, says) in [
        (vec!["--store", ""], "--store"),
        (
            vec!["--store", pg.url.as_str(), "--objects", "bucket"],
            "not an object store URL",
        ),
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = command("monad-server");
        cmd.arg("--data-dir")
            .arg(data.path())
            .args(["--listen", "127.0.0.1:0", "--no-http"])
            .args(&args);
        let out = within(STEP, "a refused start", cmd.output()).await.unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(said.contains(says), "{args:?}: {said}");
        assert!(!said.contains("panicked"), "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_whose_host_is_killed_mid_call_re_attaches_to_another_host_with_nothing_lost() {
    let test =
        "a_laptop_whose_host_is_killed_mid_call_re_attaches_to_another_host_with_nothing_lost";
    let Some(pg) = Pg::with_s3(test) else {
        return;
    };
    let env = pg.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let http = ["--http", "127.0.0.1:0"];
    // Two hosts on one store, with one certificate and (in PostgreSQL) one set of tokens.
    let (data_a, data_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ServerProcess::start_args(data_a.path(), &env, None, &http).await;
    let token = a.first_token.clone().expect("first start");
    share_tls(data_a.path(), data_b.path());
    let b = ServerProcess::start_args(data_b.path(), &env, None, &http).await;
    assert_eq!(a.fingerprint, b.fingerprint, "one certificate");
    let (a_http, b_http) = (a.http.expect("HTTP on A"), b.http.expect("HTTP on B"));

    // The laptop lists B, then A.
    let laptop = folder(&[("notes.txt", "before\n")]);
    let config_dir = tempfile::tempdir().unwrap();
    let config = ClientConfig::with_servers(
        &[b.addr.to_string(), a.addr.to_string()],
        &token,
        &a.fingerprint,
    )
    .unwrap();
    config.save(config_dir.path()).unwrap();
    let agent_b = connect_agent(&b.client_config(&token)).await;
    within(
        STEP,
        "the session to open",
        agent_b.open_session(Some(SESSION)),
    )
    .await
    .unwrap();
    let mut attach = command("monad-client")
        .arg("attach")
        .arg(laptop.path())
        .args(["--session", SESSION, "--name", "lap", "--non-interactive"])
        .args(["--allow", "read", "write", "exec"])
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .spawn()
        .expect("monad-client starts");
    let mut said = tokio::io::BufReader::new(attach.stderr.take().unwrap()).lines();
    let line = wait_for_line(&mut said, STEP, "the attach on B", |l| {
        l.starts_with("attached ")
    })
    .await;
    assert!(line.contains(&format!(" on {} ", b.addr)), "{line}");

    // Work through B: a file in the laptop's folder, a message, a command; then its records.
    let (_, ran_in) = ok(call_in(
        &agent_b,
        Some(SESSION),
        "write_file",
        json!({"path": "from-b.txt", "content": "written through B\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    ok(call_in(
        &agent_b,
        Some(SESSION),
        "run_command",
        json!({"argv": ["sh", "-c", "cat notes.txt"], "workspace": "lap"}),
    )
    .await);
    within(
        STEP,
        "a message",
        agent_b.history_append(
            Some(SESSION),
            monad_protocol::wire::HistoryMessage {
                role: monad_protocol::wire::HistoryRole::User,
                text: "asked through B".into(),
            },
        ),
    )
    .await
    .unwrap();
    // The recorder writes audit records and artifacts just after the answers: what B has
    // written (durably, in the shared store) before it dies.
    let audit_path = format!("/api/v1/sessions/{SESSION}/audit");
    let artifacts_path = format!("/api/v1/sessions/{SESSION}/artifacts");
    let (audit_b, artifacts_b) = within(STEP, "B's records of both calls", async {
        loop {
            let audit = get(b_http, &token, &audit_path).await;
            let artifacts = get(b_http, &token, &artifacts_path).await;
            if ids(&audit, "records", "callId").len() >= 2
                && !ids(&artifacts, "artifacts", "artifactId").is_empty()
            {
                break (audit, artifacts);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let mut payloads = Vec::new();
    for id in ids(&artifacts_b, "artifacts", "artifactId") {
        let path = format!("/api/v1/sessions/{SESSION}/artifacts/{id}");
        payloads.push((path.clone(), get_bytes(b_http, &token, &path).await));
    }

    // A slow command in flight through B, and B is killed.
    let caller = agent_b.clone();
    let running = tokio::spawn(async move {
        caller
            .call(
                Some(SESSION),
                "run_command",
                json!({"argv": ["sh", "-c", "echo $$ > started; exec sleep 60"], "workspace": "lap"}),
                |_| {},
            )
            .await
    });
    let started = laptop.path().join("started");
    within(STEP, "the slow command to start", async {
        while !std::fs::read_to_string(&started).is_ok_and(|t| t.ends_with('\n')) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let b_addr = b.addr;
    b.kill().await;
    // The agent on B hears of it (its connection times out): an error, not a hang.
    let answer = within(STEP, "the call through the dead host to end", running)
        .await
        .expect("the call task does not panic");
    match answer {
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(reply) => assert!(
            matches!(reply.outcome, monad_protocol::wire::Outcome::Error { .. }),
            "the call through a dead host succeeded: {reply:?}"
        ),
    }

    // The laptop re-attaches through A by itself, and says so; it ends the command the dead
    // host asked for (nobody is left to take its answer).
    let a_line = format!(" on {} ", a.addr);
    let mut lines: Vec<String> = Vec::new();
    let done = |lines: &[String]| {
        let seen = |what: &dyn Fn(&str) -> bool| lines.iter().any(|l| what(l));
        seen(&|l| l.contains("reconnecting in"))
            && seen(&|l| l.starts_with("attached ") && l.contains(&a_line))
            && seen(&|l| l.contains("run_command") && l.contains("cancelled"))
    };
    let reattached = tokio::time::timeout(STEP, async {
        while !done(&lines) {
            match said.next_line().await {
                Ok(Some(line)) => lines.push(line),
                _ => return false,
            }
        }
        true
    })
    .await;
    assert!(
        matches!(reattached, Ok(true)),
        "the laptop did not re-attach through A (or say so); it said:\n{}",
        lines.join("\n")
    );
    let lost = lines
        .iter()
        .find(|l| l.contains("reconnecting in"))
        .expect("seen");
    assert!(
        lost.contains(&b_addr.to_string()),
        "names the lost host: {lost}"
    );

    // An agent on A works in the laptop's folder, and sees what was done through B.
    let agent_a = connect_agent(&a.client_config(&token)).await;
    let (read, ran_in) = ok(call_in(
        &agent_a,
        Some(SESSION),
        "read_file",
        json!({"path": "from-b.txt", "workspace": "lap"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    assert_eq!(read["content"], "written through B\n");
    ok(call_in(
        &agent_a,
        Some(SESSION),
        "write_file",
        json!({"path": "from-a.txt", "content": "written through A\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("from-a.txt")).unwrap(),
        "written through A\n"
    );
    let (_, history) = within(
        STEP,
        "the history through A",
        agent_a.history(Some(SESSION)),
    )
    .await
    .unwrap();
    assert!(
        history.messages.iter().any(|m| m.text == "asked through B"),
        "{history:?}"
    );
    // Every audit record and artifact B had written is readable through A, the same.
    let audit_a = get(a_http, &token, &audit_path).await;
    for call in ids(&audit_b, "records", "callId") {
        assert!(
            ids(&audit_a, "records", "callId").contains(&call),
            "audit record {call} of B is missing on A: {audit_a}"
        );
    }
    let artifacts_a = get(a_http, &token, &artifacts_path).await;
    for id in ids(&artifacts_b, "artifacts", "artifactId") {
        assert!(
            ids(&artifacts_a, "artifacts", "artifactId").contains(&id),
            "artifact {id} of B is missing on A: {artifacts_a}"
        );
    }
    for (path, payload) in payloads {
        assert_eq!(get_bytes(a_http, &token, &path).await, payload, "{path}");
    }
    let _ = attach.start_kill();
    drop(agent_a);
    a.stop().await;
}

/// A loopback UDP address where nothing answers: a socket bound and never read (kept for as
/// long as the caller holds it, so no other process takes the port meanwhile).
fn silent_address() -> (std::net::UdpSocket, String) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    (socket, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_passes_over_a_host_that_does_not_answer_and_names_every_host_when_none_does() {
    let server = monad_tests::TestServer::start().await;
    let (_silent, dead) = silent_address();
    let (_silent2, dead2) = silent_address();
    let live = server.addr.to_string();
    let config = ClientConfig::with_servers(
        &[dead.clone(), live.clone()],
        &server.token,
        &server.fingerprint,
    )
    .unwrap();
    let agent = within(
        STEP,
        "connect",
        monad_client::agent::Agent::connect(&config),
    )
    .await
    .expect("the second host answers");
    assert_eq!(agent.server(), live);
    let (_, ran_in) = ok(call_in(&agent, None, "list_dir", json!({})).await);
    assert_eq!(ran_in, "primary");

    let config = ClientConfig::with_servers(
        &[dead.clone(), dead2.clone()],
        &server.token,
        &server.fingerprint,
    )
    .unwrap();
    let e = within(
        STEP,
        "connect",
        monad_client::agent::Agent::connect(&config),
    )
    .await
    .expect_err("nobody answers")
    .to_string();
    assert!(e.contains("none of the 2 servers answered"), "{e}");
    let (first, second) = (
        e.find(&format!("{dead}: no answer within 3 s")),
        e.find(&format!("{dead2}: no answer within 3 s")),
    );
    assert!(
        first.is_some() && second.is_some() && first < second,
        "every host in order: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_another_certificate_stops_the_connect_instead_of_being_passed_over() {
    let real = monad_tests::TestServer::start().await;
    let other = monad_tests::TestServer::start().await;
    assert_ne!(real.fingerprint, other.fingerprint);
    let config = ClientConfig::with_servers(
        &[other.addr.to_string(), real.addr.to_string()],
        &real.token,
        &real.fingerprint,
    )
    .unwrap();
    let e = within(
        STEP,
        "connect",
        monad_client::agent::Agent::connect(&config),
    )
    .await
    .expect_err("a changed certificate is not hidden by another host");
    match e {
        monad_client::ClientError::FingerprintMismatch {
            server, presented, ..
        } => {
            assert_eq!(server, other.addr.to_string());
            assert_eq!(presented, other.fingerprint);
        }
        other => panic!("not a fingerprint mismatch: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_with_several_servers_checks_each_keeps_one_that_is_down_and_status_shows_them() {
    let server = monad_tests::TestServer::start().await;
    let (_silent, dead) = silent_address();
    let live = server.addr.to_string();
    let dir = tempfile::tempdir().unwrap();
    let client = |args: Vec<String>| {
        let mut cmd = command("monad-client");
        cmd.args(&args)
            .env("MONAD_TOKEN", &server.token)
            .env("MONAD_CONFIG_DIR", dir.path());
        async move { within(STEP, "monad-client", cmd.output()).await.unwrap() }
    };
    let login = |servers: &[&str]| {
        let mut args = vec!["login".to_owned()];
        for s in servers {
            args.extend(["--server".to_owned(), (*s).to_owned()]);
        }
        args.extend(["--fingerprint".to_owned(), server.fingerprint.clone()]);
        args
    };
    let out = client(login(&[&dead, &live])).await;
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("logged in to {dead}, {live} as")),
        "{said}"
    );
    assert!(
        said.contains(&format!("warning: {dead} did not answer")),
        "{said}"
    );
    let saved = ClientConfig::load(dir.path()).unwrap();
    assert_eq!(
        (saved.server.as_str(), saved.servers.clone()),
        (dead.as_str(), vec![live.clone()])
    );

    let out = client(vec!["status".into()]).await;
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains(&format!(
            "servers      {dead}, {live} (connected to {live})"
        )),
        "{shown}"
    );
    let out = client(vec!["status".into(), "--json".into()]).await;
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["servers"], json!([dead, live]));
    assert_eq!(status["connected_to"], json!(live));

    // Bad input changes nothing: the config stays as it was.
    for (servers, says) in [
        (vec!["a b:1"], "is not a server address"),
        (vec![live.as_str(), live.as_str()], "is listed twice"),
        (vec![&dead], "no answer within 3 s"),
    ] {
        let out = client(login(&servers)).await;
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{servers:?}: {said}");
        assert!(said.contains(says), "{servers:?}: {said}");
        assert_eq!(
            ClientConfig::load(dir.path()).unwrap(),
            saved,
            "{servers:?}"
        );
    }
}

/// Issue 14's three hosts on one PostgreSQL + S3 store, each with the hosts' secret: the laptop
/// attached to host B (its config lists B, then C), the agent on host A, whose calls into the
/// laptop's folder are forwarded to B. B is killed with SIGKILL mid-call: the agent's call ends
/// with an error, the laptop re-attaches through C by itself once B's lease has run out, the
/// agent's next calls (still on A) are forwarded to C and work, and the session's history, audit
/// records and artifacts written through B are all there, at a higher lease epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_the_laptops_host_killed_mid_call_the_agent_on_another_goes_on_with_nothing_lost()
 {
    let test = "three_hosts_the_laptops_host_killed_mid_call";
    let Some(pg) = Pg::with_s3(test) else {
        return;
    };
    let mut env = pg.env();
    env.push((
        "MONAD_CLUSTER_SECRET".into(),
        "the-three-hosts-secret".into(),
    ));
    env.push(("MONAD_CLUSTER_LEASE_SECS".into(), "2".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let http = ["--http", "127.0.0.1:0"];
    let (data_a, data_b, data_c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = ServerProcess::start_args(data_a.path(), &env, None, &http).await;
    let token = a.first_token.clone().expect("first start");
    share_tls(data_a.path(), data_b.path());
    share_tls(data_a.path(), data_c.path());
    let b = ServerProcess::start_args(data_b.path(), &env, None, &[]).await;
    let c = ServerProcess::start_args(data_c.path(), &env, None, &[]).await;
    let a_http = a.http.expect("HTTP on A");

    let laptop = folder(&[("notes.txt", "before\n")]);
    let config_dir = tempfile::tempdir().unwrap();
    ClientConfig::with_servers(
        &[b.addr.to_string(), c.addr.to_string()],
        &token,
        &a.fingerprint,
    )
    .unwrap()
    .save(config_dir.path())
    .unwrap();
    let mut attach = command("monad-client")
        .arg("attach")
        .arg(laptop.path())
        .args(["--session", SESSION, "--name", "lap", "--non-interactive"])
        .args(["--allow", "read", "write", "exec"])
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .spawn()
        .expect("monad-client starts");
    let mut said = tokio::io::BufReader::new(attach.stderr.take().unwrap()).lines();
    let line = wait_for_line(&mut said, STEP, "the attach on B", |l| {
        l.starts_with("attached ")
    })
    .await;
    assert!(line.contains(&format!(" on {} ", b.addr)), "{line}");
    let epoch_of = |pg: &Pg| {
        let database = pg.url.rsplit('/').next().unwrap();
        monad_tests::pg::cluster()
            .unwrap()
            .psql(
                database,
                &format!("SELECT epoch FROM leases WHERE session_id = '{SESSION}'"),
            )
            .unwrap()
            .trim()
            .parse::<i64>()
            .unwrap()
    };
    let epoch_b = epoch_of(&pg);

    // The agent on A works in the laptop's folder on B: forwarded.
    let agent = connect_agent(&a.client_config(&token)).await;
    let (_, ran_in) = ok(call_in(
        &agent,
        Some(SESSION),
        "write_file",
        json!({"path": "via-b.txt", "content": "forwarded to B\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("via-b.txt")).unwrap(),
        "forwarded to B\n"
    );
    within(
        STEP,
        "a message",
        agent.history_append(
            Some(SESSION),
            monad_protocol::wire::HistoryMessage {
                role: monad_protocol::wire::HistoryRole::User,
                text: "asked on A".into(),
            },
        ),
    )
    .await
    .unwrap();
    let audit_path = format!("/api/v1/sessions/{SESSION}/audit");
    let artifacts_path = format!("/api/v1/sessions/{SESSION}/artifacts");
    let (audit_b, artifacts_b) = within(STEP, "B's records of the call", async {
        loop {
            let audit = get(a_http, &token, &audit_path).await;
            let artifacts = get(a_http, &token, &artifacts_path).await;
            if !ids(&audit, "records", "callId").is_empty()
                && !ids(&artifacts, "artifacts", "artifactId").is_empty()
            {
                break (audit, artifacts);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let mut payloads = Vec::new();
    for id in ids(&artifacts_b, "artifacts", "artifactId") {
        let path = format!("/api/v1/sessions/{SESSION}/artifacts/{id}");
        payloads.push((path.clone(), get_bytes(a_http, &token, &path).await));
    }

    // A slow command, forwarded from A to B, and B is killed while it runs.
    let caller = agent.clone();
    let running = tokio::spawn(async move {
        caller
            .call(
                Some(SESSION),
                "run_command",
                json!({"argv": ["sh", "-c", "echo $$ > started; exec sleep 60"], "workspace": "lap"}),
                |_| {},
            )
            .await
    });
    let started = laptop.path().join("started");
    within(STEP, "the slow command to start", async {
        while !std::fs::read_to_string(&started).is_ok_and(|t| t.ends_with('\n')) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    b.kill().await;
    let answer = within(STEP, "the forwarded call to end", running)
        .await
        .expect("the call task does not panic");
    if let Ok(reply) = answer {
        assert!(
            matches!(reply.outcome, monad_protocol::wire::Outcome::Error { .. }),
            "the call through a dead host succeeded: {reply:?}"
        );
    }

    // The laptop re-attaches through C by itself.
    let c_line = format!(" on {} ", c.addr);
    wait_for_line(&mut said, STEP, "the re-attach through C", |l| {
        l.starts_with("attached ") && l.contains(&c_line)
    })
    .await;
    assert!(
        epoch_of(&pg) > epoch_b,
        "C took the session at a higher epoch"
    );

    // The agent, still on A, goes on: its calls are forwarded to C now.
    let (read, ran_in) = ok(call_in(
        &agent,
        Some(SESSION),
        "read_file",
        json!({"path": "via-b.txt", "workspace": "lap"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    assert_eq!(read["content"], "forwarded to B\n");
    ok(call_in(
        &agent,
        Some(SESSION),
        "write_file",
        json!({"path": "via-c.txt", "content": "forwarded to C\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("via-c.txt")).unwrap(),
        "forwarded to C\n"
    );
    let (_, history) = within(STEP, "the history", agent.history(Some(SESSION)))
        .await
        .unwrap();
    assert!(
        history.messages.iter().any(|m| m.text == "asked on A"),
        "{history:?}"
    );
    let audit = get(a_http, &token, &audit_path).await;
    for call in ids(&audit_b, "records", "callId") {
        assert!(
            ids(&audit, "records", "callId").contains(&call),
            "audit record {call} written by B is missing: {audit}"
        );
    }
    let artifacts = get(a_http, &token, &artifacts_path).await;
    for id in ids(&artifacts_b, "artifacts", "artifactId") {
        assert!(
            ids(&artifacts, "artifacts", "artifactId").contains(&id),
            "artifact {id} written by B is missing: {artifacts}"
        );
    }
    for (path, payload) in payloads {
        assert_eq!(get_bytes(a_http, &token, &path).await, payload, "{path}");
    }
    let _ = attach.start_kill();
    drop(agent);
    c.stop().await;
    a.stop().await;
}
