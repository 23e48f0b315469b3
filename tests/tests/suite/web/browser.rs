//! The web view in a real headless browser (Debian's `chromium`, driven through
//! `chromedriver` with fantoccini): sign in, open a session, expand a tool call and see its
//! diff, see a new call appear live, and an XSS corpus that must not run. Screenshots are
//! written under the test target dir (their paths are printed).

use std::path::PathBuf;
use std::process::Stdio;

use fantoccini::{Client, ClientBuilder, Locator};
use monad_tests::{STEP, call_in, ok, peer_missing, within};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use super::pages::hostile_session;
use super::{Api, server};

/// An executable on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// One browser at a time: three Chromiums starting together beside the rest of the suite on two
/// cores took more than 20 s to give a session (CI saw it).
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a browser session may take to start: a cold Chromium reads some 370 MB from disk.
const BROWSER_START: std::time::Duration = std::time::Duration::from_secs(90);

/// chromedriver on a port of its choosing, and a headless browser session through it with a
/// temporary profile. Holds [`ONE_BROWSER`] while it lives.
struct Driver {
    client: Client,
    process: tokio::process::Child,
    _profile: tempfile::TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(pid) = self.process.id() {
            let group = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Driver {
    async fn start(chromium: &std::path::Path, chromedriver: &std::path::Path) -> Driver {
        let turn = ONE_BROWSER.lock().await;
        let mut process = tokio::process::Command::new(chromedriver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // A group of its own, which the browsers it starts join: all of it is killed when
            // the driver drops, a test that panicked included (killing chromedriver alone left
            // its Chromium running).
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let stdout = process.stdout.take().unwrap();
        let port: u16 = within(STEP, "chromedriver to say its port", async {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').trim().parse().unwrap();
                }
            }
            panic!("chromedriver ended without saying its port");
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // The test runs as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1500",
                    "--no-first-run",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = within(
            BROWSER_START,
            "a browser session",
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .expect("a WebDriver session");
        Driver {
            client,
            process,
            _profile: profile,
            _turn: turn,
        }
    }

    async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.wait_for_locator(Locator::Css(css)).await
    }

    async fn wait_for_locator(&self, locator: Locator<'_>) -> fantoccini::elements::Element {
        let css = format!("{locator:?}");
        match self.client.wait().at_most(STEP).for_element(locator).await {
            Ok(element) => element,
            Err(e) => {
                let shot = self.screenshot("web-failure.png").await;
                let source = self.client.source().await.unwrap_or_default();
                panic!(
                    "no `{css}` on the page ({e}); screenshot {}; page:\n{source}",
                    shot.display()
                );
            }
        }
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }
}

#[tokio::test]
async fn a_person_signs_in_opens_a_session_expands_a_diff_and_sees_a_call_arrive_live() {
    let (Some(chromium), Some(chromedriver)) = (on_path("chromium"), on_path("chromedriver"))
    else {
        peer_missing(
            "web::browser",
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
        return;
    };
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let agent = server.agent().await;
    let session = super::new_session();
    let ws = api.workspace(Some("/home/ana/demo")).await;
    api.snapshot(
        &ws,
        &session,
        "task_001",
        &[
            ("user", "Add a greeting to **hello.txt**, please."),
            (
                "assistant",
                "Done: `hello.txt` now says *hello*. I also listed the folder.",
            ),
        ],
    )
    .await;
    ok(call_in(
        &agent,
        Some(&session),
        "write_file",
        json!({"path": "hello.txt", "content": "hi\n"}),
    )
    .await);
    ok(call_in(
        &agent,
        Some(&session),
        "edit_file",
        json!({"path": "hello.txt", "old_string": "hi", "new_string": "hello, world"}),
    )
    .await);
    ok(call_in(&agent, Some(&session), "list_dir", json!({})).await);
    server.audit_lines(&session, 3).await;

    let driver = Driver::start(&chromium, &chromedriver).await;
    let c = &driver.client;
    let base = format!("http://{http}");
    c.goto(&format!("{base}/")).await.unwrap();
    // Sent to sign in.
    driver
        .wait_for("#token")
        .await
        .send_keys(&server.token)
        .await
        .unwrap();
    driver.wait_for("#signin").await.click().await.unwrap();
    driver.wait_for("#sessions .row.session").await;
    let cookie_visible: Value = c.execute("return document.cookie", vec![]).await.unwrap();
    assert_eq!(cookie_visible, json!(""), "the sign-in cookie is HttpOnly");
    driver.screenshot("web-sessions.png").await;

    // Open the session from the list.
    c.find(Locator::Css(&format!("a[href='/sessions/{session}']")))
        .await
        .expect("the session is listed")
        .click()
        .await
        .unwrap();
    driver.wait_for("body[data-live='on']").await;
    let conversation = driver.wait_for("#conversation").await.text().await.unwrap();
    assert!(conversation.contains("Add a greeting"), "{conversation}");
    driver.wait_for("#conversation strong").await;

    // Outputs are collapsed; expanding the edit shows its coloured diff.
    let edit = driver.wait_for("details.call:nth-of-type(2)").await;
    assert_eq!(edit.attr("open").await.unwrap(), None);
    edit.find(Locator::Css("summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let added = driver.wait_for("details.call[open] pre.diff .add").await;
    assert!(added.text().await.unwrap().contains("+hello, world"));
    let removed = driver.wait_for("details.call[open] pre.diff .del").await;
    assert!(removed.text().await.unwrap().contains("-hi"));

    // A new call appears while the page is open.
    ok(call_in(
        &agent,
        Some(&session),
        "write_file",
        json!({"path": "live.txt", "content": "arrived\n"}),
    )
    .await);
    let live = driver.wait_for("details.call:nth-of-type(4) .target").await;
    assert_eq!(live.text().await.unwrap(), "live.txt");
    // Its diff is marked (the diff may be stored a moment after the call's line).
    driver
        .wait_for("details.call:nth-of-type(4) summary .badge")
        .await;
    // The count follows.
    driver
        .wait_for_locator(Locator::XPath("//span[@id='call-count' and text()='4']"))
        .await;
    driver.screenshot("web-session.png").await;

    // The workspace's page lists the session.
    c.goto(&format!("{base}/workspaces/{ws}")).await.unwrap();
    driver
        .wait_for(&format!("a[href='/sessions/{session}']"))
        .await;

    // Sign out: back to the sign-in page, and the pages are closed.
    driver.wait_for("#signout").await.click().await.unwrap();
    driver.wait_for("#token").await;
    c.goto(&format!("{base}/")).await.unwrap();
    driver.wait_for("#token").await;
    c.clone().close().await.unwrap();
}

#[tokio::test]
async fn an_xss_corpus_in_history_file_names_and_artifacts_does_not_run_in_the_browser() {
    let (Some(chromium), Some(chromedriver)) = (on_path("chromium"), on_path("chromedriver"))
    else {
        peer_missing(
            "web::browser",
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
        return;
    };
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let session = hostile_session(&server, &api).await;
    let driver = Driver::start(&chromium, &chromedriver).await;
    let c = &driver.client;
    let base = format!("http://{http}");
    c.goto(&format!("{base}/login")).await.unwrap();
    driver
        .wait_for("#token")
        .await
        .send_keys(&server.token)
        .await
        .unwrap();
    driver.wait_for("#signin").await.click().await.unwrap();
    driver.wait_for("#sessions").await;
    c.goto(&format!("{base}/sessions/{session}")).await.unwrap();
    driver.wait_for("body[data-live='on']").await;
    // Open every call, so every output and diff is on the page.
    let calls = c
        .find_all(Locator::Css("details.call summary"))
        .await
        .unwrap();
    assert!(calls.len() >= 2);
    for summary in &calls {
        summary.click().await.unwrap();
    }
    let opened = c
        .find_all(Locator::Css("details.call"))
        .await
        .unwrap()
        .len();
    within(STEP, "every call's output", async {
        loop {
            let loading = c
                .execute(
                    "return document.querySelectorAll('details.call .body .muted').length \
                     - document.querySelectorAll('details.call .body .artifact .muted').length",
                    vec![],
                )
                .await
                .unwrap();
            if loading == json!(0) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(
        c.find_all(Locator::Css("details.call pre.diff"))
            .await
            .unwrap()
            .len(),
        opened,
        "every write's diff is shown"
    );
    // Click every link the conversation rendered (a `javascript:` one would run now).
    for link in c.find_all(Locator::Css("#conversation a")).await.unwrap() {
        let href = link.attr("href").await.unwrap().unwrap_or_default();
        assert!(!href.to_lowercase().starts_with("javascript"), "{href}");
    }
    driver.screenshot("web-xss.png").await;
    let pwned: Value = c
        .execute("return document.body.dataset.pwned || null", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, Value::Null, "a script of the corpus ran");
    assert!(c.get_alert_text().await.is_err(), "an alert is open");
    let text: Value = c
        .execute(
            "return document.getElementById('conversation').innerText",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        text.as_str().unwrap().contains("<script>"),
        "the corpus is shown as text"
    );
    c.clone().close().await.unwrap();
}

/// A call to a restricted folder shows in the session's timeline while it waits for the
/// folder owner's approval (a pending row that says so), and turns into its final row once the
/// owner answers and the call is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_approval_shows_as_pending_then_as_its_final_row() {
    let (Some(chromium), Some(chromedriver)) = (on_path("chromium"), on_path("chromedriver"))
    else {
        peer_missing(
            "web::browser",
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
        return;
    };
    let (server, http) = server().await;
    let (_dir, attached, mut questions) =
        super::gated_folder(&server, &[("plan.txt", "step one\n")]).await;
    let session = attached.session.clone();
    let agent = server.agent().await;
    // One recorded call, so the timeline is not empty.
    ok(call_in(&agent, Some(&session), "list_dir", json!({})).await);
    server.audit_lines(&session, 1).await;

    let driver = Driver::start(&chromium, &chromedriver).await;
    let c = &driver.client;
    let base = format!("http://{http}");
    c.goto(&format!("{base}/login")).await.unwrap();
    driver
        .wait_for("#token")
        .await
        .send_keys(&server.token)
        .await
        .unwrap();
    driver.wait_for("#signin").await.click().await.unwrap();
    driver.wait_for("#sessions").await;
    c.goto(&format!("{base}/sessions/{session}")).await.unwrap();
    driver.wait_for("body[data-live='on']").await;
    driver.wait_for("details.call").await;

    let call = call_in(
        &agent,
        Some(&session),
        "read_file",
        json!({"path": "plan.txt", "workspace": "lap"}),
    );
    let watch = async {
        // Pending before the owner answers: the row says it waits for approval.
        let row = driver.wait_for(".call.pending[data-state='waiting']").await;
        let text = row.text().await.unwrap();
        assert!(text.contains("read_file"), "{text}");
        assert!(text.contains("plan.txt"), "{text}");
        assert!(text.contains("waiting for approval"), "{text}");
        let (question, answer) = within(STEP, "the owner to be asked", questions.recv())
            .await
            .expect("asked");
        assert_eq!(question.target, "plan.txt");
        driver.screenshot("web-pending.png").await;
        answer
            .send(monad_client::approval::Decision::AllowOnce)
            .unwrap();
        // Its final row, and no pending row left.
        driver
            .wait_for_locator(Locator::XPath(
                "//details[contains(@class,'call')]//span[contains(@class,'target') and text()='plan.txt']",
            ))
            .await;
        within(STEP, "the pending row to go", async {
            loop {
                let left = c
                    .execute(
                        "return document.querySelectorAll('.call.pending').length",
                        vec![],
                    )
                    .await
                    .unwrap();
                if left == json!(0) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await;
        let decided = c
            .find(Locator::Css("details.call:last-of-type summary"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(decided.contains("user"), "decided by the owner: {decided}");
        driver.screenshot("web-pending-done.png").await;
    };
    let (reply, ()) = tokio::join!(call, watch);
    ok(reply);
    c.clone().close().await.unwrap();
}
