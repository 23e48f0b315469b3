//! Authentication and ownership (DESIGN.md, "Security model"): tokens, users' sessions, and the
//! pinned certificate.

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_protocol::ErrorCode;
use monad_protocol::tools::ToolClass;
use monad_protocol::wire::Outcome;
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, call, call_in, connect_agent, expect_code,
    folder, ok, within,
};
use serde_json::json;

/// Connecting must fail; returns the error.
async fn refused(config: &monad_client::config::ClientConfig) -> ClientError {
    match within(STEP, "the connection to be refused", Agent::connect(config)).await {
        Ok(_) => panic!("the connection was accepted"),
        Err(e) => e,
    }
}

fn assert_unauthorized(error: &ClientError) {
    match error {
        ClientError::Refused(e) => assert_eq!(e.code, ErrorCode::Unauthorized, "{e}"),
        other => panic!("expected an unauthorized refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_token_is_refused_as_unauthorized() {
    let server = TestServer::start().await;
    let error = refused(&server.client_config_with("mnd_00000000_not_a_real_token")).await;
    assert_unauthorized(&error);
    let message = error.to_string();
    assert!(
        message.contains("monad-server token create"),
        "says what to do: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_token_is_refused() {
    let server = TestServer::start().await;
    let token = server.create_token("carol");
    let config = server.client_config_with(&token);
    assert_eq!(connect_agent(&config).await.user(), "carol");
    let record = server
        .state()
        .tokens
        .list()
        .unwrap()
        .into_iter()
        .find(|t| t.user == "carol")
        .expect("carol's token is listed");
    assert!(server.state().tokens.revoke(&record.id).unwrap());
    assert_unauthorized(&refused(&config).await);
    // Other tokens still work.
    assert_eq!(server.agent().await.user(), "admin");
}

/// Regression: a request over the connection's bound was refused by writing the refusal in the
/// loop that accepts the connection's streams, so a peer that gave that stream no room (it
/// never reads it) held the loop for good, and with it the check of its token: a revoked
/// token's connection went on. The refusal is written on its own, within a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_the_peer_never_reads_does_not_keep_a_revoked_token_connected() {
    use monad_protocol::wire::{PROTOCOL_MINOR, Role};
    let server = TestServer::start_with(|c| c.max_calls_per_connection = 1).await;
    let token = server.create_token("dan");
    let mut transport = quinn::TransportConfig::default();
    // Room for the welcome, read a piece at a time; none for a refusal nobody reads.
    transport.stream_receive_window(16u32.into());
    let (_endpoint, conn, _) = monad_tests::connect_speaking_over(
        &server.client_config_with(&token),
        Role::Agent,
        PROTOCOL_MINOR,
        Some(transport),
    )
    .await;
    // The one request in flight: a frame begun, never ended.
    let (mut first, _first_recv) = conn.open_bi().await.unwrap();
    first.write_all(&[0]).await.unwrap();
    // Over the bound: refused, and never read.
    let (mut second, _second_recv) = conn.open_bi().await.unwrap();
    second.write_all(&[0]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let id = token.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    // Checked every 5 s.
    within(
        std::time::Duration::from_secs(20),
        "the revoked token's connection to close",
        conn.closed(),
    )
    .await;
}

/// Revoking a token cuts off what is connected with it, not only new connections: an attached
/// folder kept serving calls (the user's other tokens reached it) and an agent kept calling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_s_connections_are_closed() {
    let server = TestServer::start().await;
    let revoked = server.create_token("carol");
    let kept = server.create_token("carol");
    let dir = folder(&[("a.txt", "hello\n")]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config_with(&revoked), options, None).await;
    let cut = connect_agent(&server.client_config_with(&revoked)).await;
    let agent = connect_agent(&server.client_config_with(&kept)).await;
    let read = json!({"path": "a.txt", "workspace": "laptop"});
    ok(call(&agent, "read_file", read.clone()).await);
    ok(call(&cut, "read_file", read.clone()).await);
    let id = revoked.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    // Checked every 5 s: within three checks the folder is offline and the agent cut off.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let reply = call(&agent, "read_file", read.clone()).await;
        if let Outcome::Error { error } = &reply.outcome {
            assert_ne!(error.code, ErrorCode::Internal, "{error}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the folder attached with a revoked token still serves calls"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The agent's own connection is closed: even a call that always answers fails.
    loop {
        if cut
            .call(None, "workspaces", json!({}), |_| {})
            .await
            .is_err()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a call on a revoked token's connection was served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let _ = read;
    assert_unauthorized(&refused(&server.client_config_with(&revoked)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_session_is_refused_and_not_listed() {
    let server = TestServer::start().await;
    let admin = server.agent().await;
    ok(call(
        &admin,
        "write_file",
        json!({"path": "secret.txt", "content": "admin's\n"}),
    )
    .await);
    let ben_token = server.create_token("ben");
    let ben_config = server.client_config_with(&ben_token);
    let ben = connect_agent(&ben_config).await;
    assert_eq!(ben.user(), "ben");

    // Naming no session, ben gets a default of his own, where admin's file is not.
    let (own_default, _) = ok(call_in(&ben, None, "workspaces", json!({})).await);
    let own_default = own_default["session"].as_str().unwrap().to_owned();
    assert_ne!(own_default, "default");
    expect_code(
        call_in(&ben, None, "read_file", json!({"path": "secret.txt"})).await,
        ErrorCode::NotFound,
    );
    // Naming `default`, for a call or an attachment, means his own default, never admin's.
    let (named, _) = ok(call_in(&ben, Some("default"), "workspaces", json!({})).await);
    assert_eq!(named["session"], own_default.as_str());
    expect_code(
        call_in(
            &ben,
            Some("default"),
            "read_file",
            json!({"path": "secret.txt"}),
        )
        .await,
        ErrorCode::NotFound,
    );
    let dir = folder(&[]);
    let mut options = attach_options(dir.path(), "ben");
    options.session = Some("default".into());
    let attached = Attachment::start(&ben_config, options, None).await;
    assert_eq!(attached.session, own_default);
    let (admins, _) = ok(call(&admin, "workspaces", json!({})).await);
    assert!(
        !admins.to_string().contains("\"ben\""),
        "ben's folder reached admin's default: {admins}"
    );
    drop(attached);

    // Ben's own session works.
    let own = "6f9619ff-8b86-4011-b42d-00c04fc964ff";
    ok(call_in(
        &ben,
        Some(own),
        "write_file",
        json!({"path": "b.txt", "content": "ben's\n"}),
    )
    .await);
    let (result, _) = ok(call_in(&ben, Some(own), "read_file", json!({"path": "b.txt"})).await);
    assert_eq!(result["content"], "ben's\n");
    // And admin cannot use it.
    assert!(matches!(
        within(STEP, "admin's call", admin.call(Some(own), "workspaces", json!({}), |_| {})).await,
        Err(ClientError::Refused(e)) if e.code == ErrorCode::Unauthorized
    ));

    // Each lists only their own sessions.
    let ids = |sessions: Vec<monad_protocol::wire::SessionInfo>| -> Vec<(String, String)> {
        sessions.into_iter().map(|s| (s.id, s.owner)).collect()
    };
    let bens = within(STEP, "ben's sessions", ben.sessions())
        .await
        .unwrap();
    let mut bens = ids(bens);
    bens.sort();
    let mut want = [
        (own.to_owned(), "ben".to_owned()),
        (own_default.clone(), "ben".to_owned()),
    ];
    want.sort();
    assert_eq!(bens, want);
    let admins = within(STEP, "admin's sessions", admin.sessions())
        .await
        .unwrap();
    assert_eq!(ids(admins), [("default".to_owned(), "admin".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_certificate_is_refused_saying_what_to_do() {
    let server = TestServer::start().await;
    let mut config = server.client_config();
    config.fingerprint = "ab".repeat(32);
    match refused(&config).await {
        ClientError::FingerprintMismatch {
            server: addr,
            expected,
            presented,
        } => {
            assert_eq!(addr, server.addr.to_string());
            assert_eq!(expected, "ab".repeat(32));
            assert_eq!(presented, server.fingerprint);
            let message = ClientError::FingerprintMismatch {
                server: addr,
                expected,
                presented,
            }
            .to_string();
            assert!(message.contains("log in again"), "{message}");
            assert!(message.contains("--fingerprint"), "{message}");
            assert!(message.contains(&server.fingerprint), "{message}");
        }
        other => panic!("expected a fingerprint mismatch, got {other:?}"),
    }
}

/// Regression: revoking a token closed its connections only: a loop a leaked token's call left
/// running in the background in a primary workspace ran on until the server stopped (and kept
/// its session from being deleted). The processes its calls started end with it; those another
/// token of the same user started go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_s_background_processes_end() {
    let server = TestServer::start().await;
    let leaked = server.create_token("carol");
    let kept = server.create_token("carol");
    let intruder = connect_agent(&server.client_config_with(&leaked)).await;
    let owner = connect_agent(&server.client_config_with(&kept)).await;
    let loop_args = |file: &str| {
        json!({
            "argv": ["sh", "-c", format!("while true; do echo x >> {file}; sleep 0.1; done")],
            "background": true,
        })
    };
    let (theirs, _) = ok(call(&intruder, "run_command", loop_args("theirs.txt")).await);
    let (mine, _) = ok(call(&owner, "run_command", loop_args("mine.txt")).await);
    let running = monad_tests::process_running;
    let (listing, _) = ok(call(&owner, "process_list", json!({})).await);
    assert!(
        running(&listing, &theirs["process"]) && running(&listing, &mine["process"]),
        "{listing}"
    );
    let id = leaked.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    within(
        std::time::Duration::from_secs(20),
        "the revoked token's loop to end",
        async {
            loop {
                let (listing, _) = ok(call(&owner, "process_list", json!({})).await);
                if !running(&listing, &theirs["process"]) {
                    assert!(running(&listing, &mine["process"]), "{listing}");
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        },
    )
    .await;
    ok(call(
        &owner,
        "process_kill",
        json!({"process": mine["process"], "signal": "KILL"}),
    )
    .await);
}
