//! Device ids are only device ids (issue 9, item 9): a client cannot name another user's
//! default session or another user's device through its hello.

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_client::config::ClientConfig;
use monad_protocol::ErrorCode;
use monad_tests::{STEP, TestServer, call_in, connect_agent, ok, within};
use serde_json::json;

/// The session a call without a session lands in, for `agent`.
async fn unnamed_session(agent: &Agent) -> String {
    let (result, _) = ok(call_in(agent, None, "workspaces", json!({})).await);
    result["session"].as_str().expect("a session id").to_owned()
}

/// Connects, or returns the refusal.
async fn try_connect(config: &ClientConfig) -> Result<Agent, ClientError> {
    within(STEP, "a connection", Agent::connect(config)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_naming_another_users_default_or_device_changes_nothing_of_theirs() {
    let server = TestServer::start().await;
    // admin takes the well-known `default`; ben gets a default of his own.
    let admin = server.agent().await;
    assert_eq!(unnamed_session(&admin).await, "default");
    let ben_config = server.client_config_with(&server.create_token("ben"));
    let ben = connect_agent(&ben_config).await;
    let ben_default = unnamed_session(&ben).await;
    assert_ne!(ben_default, "default");
    // Ben's second device works in a session of his choice, and stays bound to it.
    let mut ben_phone = server.client_config_with(&ben_config.token);
    ben_phone.client_name = "phone".into();
    let phone = connect_agent(&ben_phone).await;
    let chosen = "11111111-2222-4333-8444-555555555555";
    ok(call_in(&phone, Some(chosen), "workspaces", json!({})).await);
    assert_eq!(unnamed_session(&phone).await, chosen);

    // Carol claims ben's default through the old binding key, then ben's phone's device id,
    // and works in a session of her own from each.
    let carol_token = server.create_token("carol");
    let carols = "99999999-8888-4777-8666-555555555555";
    for device in ["user:ben".to_owned(), ben_phone.device_id.clone()] {
        let mut carol = server.client_config_with(&carol_token);
        carol.device_id = device.clone();
        match try_connect(&carol).await {
            Ok(agent) => {
                ok(call_in(&agent, Some(carols), "workspaces", json!({})).await);
            }
            Err(ClientError::Refused(e)) => {
                assert_eq!(e.code, ErrorCode::InvalidArguments, "{device}: {e}");
                assert!(e.message.contains("device id"), "{device}: {e}");
            }
            Err(e) => panic!("{device}: {e}"),
        }
    }

    // Nothing of ben's moved: his default, and his phone's session.
    let ben = connect_agent(&ben_config).await;
    assert_eq!(unnamed_session(&ben).await, ben_default, "ben's default");
    let phone = connect_agent(&ben_phone).await;
    assert_eq!(unnamed_session(&phone).await, chosen, "ben's phone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hellos_with_bad_device_ids_or_client_names_are_refused() {
    let server = TestServer::start().await;
    let good = server.client_config();
    let mut cases: Vec<(ClientConfig, &str)> = Vec::new();
    for device in [
        "user:admin",
        "",
        "not-a-uuid",
        // A UUID, but not in its canonical lowercase hyphenated form.
        "6F9619FF-8B86-4011-B42D-00C04FC964FF",
        "6f9619ff8b864011b42d00c04fc964ff",
        "{6f9619ff-8b86-4011-b42d-00c04fc964ff}",
    ] {
        let mut c = good.clone();
        c.device_id = device.to_owned();
        cases.push((c, "device id"));
    }
    let long = "x".repeat(65);
    for name in [
        "",
        long.as_str(),
        "lap:top",
        "lap/top",
        "lap\u{1b}[2Jtop",
        "lap\ntop",
        "lap\u{202e}pot",
        "lap\u{200b}top",
    ] {
        let mut c = good.clone();
        c.client_name = name.to_owned();
        cases.push((c, "client name"));
    }
    for (config, what) in cases {
        match try_connect(&config).await {
            Err(ClientError::Refused(e)) => {
                assert_eq!(e.code, ErrorCode::InvalidArguments, "{config:?}: {e}");
                assert!(e.message.contains(what), "{config:?}: {e}");
            }
            Ok(_) => panic!("accepted {:?} / {:?}", config.device_id, config.client_name),
            Err(e) => panic!("{config:?}: {e}"),
        }
    }
    // The good one, and a name with Unicode letters of 64 characters, still work.
    connect_agent(&good).await;
    let mut unicode = good.clone();
    unicode.client_name = "é".repeat(64);
    connect_agent(&unicode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_ever_new_device_ids_keeps_only_their_most_recently_used_bindings() {
    let server = TestServer::start_with(|c| c.quotas.max_devices_per_user = 3).await;
    let chosen = "11111111-2222-4333-8444-555555555555";
    // Six installs (a fresh device id each) work in a chosen session, one after the other.
    let mut devices = Vec::new();
    for _ in 0..6 {
        let config = server.client_config();
        let agent = connect_agent(&config).await;
        ok(call_in(&agent, Some(chosen), "workspaces", json!({})).await);
        devices.push(config);
    }
    // Only the last three are remembered, on disk as in memory.
    let text =
        std::fs::read_to_string(server.data_dir().join("bindings.toml")).expect("bindings.toml");
    let file: toml::Table = toml::from_str(&text).expect("bindings.toml parses");
    let admins = file["bindings"]["admin"]
        .as_table()
        .expect("admin's bindings");
    assert_eq!(admins.len(), 3, "{text}");
    for config in &devices[3..] {
        assert!(admins.contains_key(&config.device_id), "{text}");
        let agent = connect_agent(config).await;
        assert_eq!(unnamed_session(&agent).await, chosen);
    }
    // The oldest, forgotten, lands in the user's default again.
    let agent = connect_agent(&devices[0]).await;
    assert_eq!(unnamed_session(&agent).await, "default");
}
