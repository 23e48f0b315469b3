//! The web view over plain HTTP: sign-in and its cookie, same-site forms, per-user isolation,
//! and an XSS corpus in history, file names and artifacts that must come out inert.

use std::net::SocketAddr;

use monad_tests::{STEP, call_in, ok, within};
use serde_json::json;

use super::{Answer, Api, http_client, new_session, server};

/// A browser-like client of the pages: the sign-in cookie, sent back by hand.
struct Browser {
    base: String,
    origin: String,
    cookie: Option<String>,
    client: reqwest::Client,
}

impl Browser {
    fn new(http: SocketAddr) -> Browser {
        Browser {
            base: format!("http://{http}"),
            origin: format!("http://{http}"),
            cookie: None,
            client: http_client(),
        }
    }

    async fn answer(response: reqwest::Response) -> Answer {
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            request = request.header("cookie", c);
        }
        Browser::answer(request.send().await.unwrap()).await
    }

    async fn post_form(&self, path: &str, form: &str, origin: Option<&str>) -> Answer {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned());
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        if let Some(c) = &self.cookie {
            request = request.header("cookie", c);
        }
        Browser::answer(request.send().await.unwrap()).await
    }

    async fn sign_in(&mut self, token: &str) -> Answer {
        let origin = self.origin.clone();
        let answer = self
            .post_form("/login", &format!("token={token}"), Some(&origin))
            .await;
        if answer.status == 303 {
            let set = answer.header("set-cookie");
            self.cookie = Some(set.split(';').next().unwrap().to_owned());
        }
        answer
    }

    /// The form token of the page at `path`.
    async fn form_token(&self, path: &str) -> String {
        let page = self.get(path).await.text();
        let at = page
            .find("name=\"formToken\" value=\"")
            .expect("a sign-out form")
            + 24;
        page[at..at + page[at..].find('"').unwrap()].to_owned()
    }
}

#[tokio::test]
async fn signing_in_gives_an_httponly_strict_cookie_and_signing_out_ends_it() {
    let (server, http) = server().await;
    let mut browser = Browser::new(http);
    let to_login = browser.get("/").await;
    assert_eq!(to_login.status, 303);
    assert_eq!(to_login.header("location"), "/login");
    let wrong = browser.sign_in("not-a-token").await;
    assert_eq!(wrong.status, 401);
    assert!(browser.cookie.is_none());

    let signed = browser.sign_in(&server.token).await;
    assert_eq!(signed.status, 303, "{}", signed.text());
    let cookie = signed.header("set-cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(
        !cookie.contains(&server.token),
        "the cookie is not the token"
    );
    let home = browser.get("/").await;
    assert_eq!(home.status, 200);
    assert!(home.text().contains("Sessions"));
    let csp = home.header("content-security-policy");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );

    let form_token = browser.form_token("/").await;
    let out = browser
        .post_form(
            "/logout",
            &format!("formToken={form_token}"),
            Some(&browser.origin.clone()),
        )
        .await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").contains("Max-Age=0"));
    // The old cookie is worth nothing now.
    assert_eq!(browser.get("/").await.status, 303);
}

#[tokio::test]
async fn forms_from_another_site_are_refused() {
    let (server, http) = server().await;
    let mut browser = Browser::new(http);
    // Signing in from another site's page (login CSRF), or with no origin at all.
    let evil = browser
        .post_form(
            "/login",
            &format!("token={}", server.token),
            Some("http://evil.example"),
        )
        .await;
    assert_eq!(evil.status, 403);
    assert!(evil.header("set-cookie").is_empty());
    let bare = browser
        .post_form("/login", &format!("token={}", server.token), None)
        .await;
    assert_eq!(bare.status, 403);

    browser.sign_in(&server.token).await;
    let form_token = browser.form_token("/").await;
    // Signing out from another site, or without the form token, does nothing.
    let cross = browser
        .post_form(
            "/logout",
            &format!("formToken={form_token}"),
            Some("http://evil.example"),
        )
        .await;
    assert_eq!(cross.status, 403);
    let tokenless = browser
        .post_form("/logout", "formToken=guess", Some(&browser.origin.clone()))
        .await;
    assert_eq!(tokenless.status, 403);
    assert_eq!(browser.get("/").await.status, 200, "still signed in");
    // A form too long for a token is refused as that, before anyone is known (axum's own
    // limit, 2 MB, let each unauthenticated connection hold that much).
    let origin = browser.origin.clone();
    let long = format!("token={}", "a".repeat(64 * 1024));
    let answer = browser.post_form("/login", &long, Some(&origin)).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    let answer = browser.post_form("/logout", &long, Some(&origin)).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
}

#[tokio::test]
async fn revoking_the_token_signs_its_browsers_out() {
    let (server, http) = server().await;
    let token = server.create_token("carol");
    let mut browser = Browser::new(http);
    browser.sign_in(&token).await;
    assert_eq!(browser.get("/").await.status, 200);
    let id = server
        .state()
        .tokens
        .list()
        .unwrap()
        .into_iter()
        .find(|t| t.user == "carol")
        .unwrap()
        .id;
    assert!(server.state().tokens.revoke(&id).unwrap());
    assert_eq!(browser.get("/").await.status, 303);
}

#[tokio::test]
async fn pages_of_another_users_session_workspace_or_artifact_are_404() {
    let (server, http) = server().await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(Some("/ana")).await;
    let session = new_session();
    let art = ana
        .upload(
            &ws,
            "tool_output",
            &session,
            "o.txt",
            "text/plain",
            b"ana's secret",
        )
        .await;
    let mut bob = Browser::new(http);
    bob.sign_in(&server.create_token("bob")).await;
    for path in [
        format!("/sessions/{session}"),
        format!("/sessions/{session}/conversation"),
        format!("/sessions/{session}/calls?from=0"),
        format!("/sessions/{session}/export.md"),
        format!("/sessions/{session}/events"),
        format!("/sessions/{session}/artifacts/{art}"),
        format!("/workspaces/{ws}"),
    ] {
        let answer = bob.get(&path).await;
        assert_eq!(answer.status, 404, "{path}");
        assert!(!answer.text().contains("secret"), "{path}");
    }
    let home = bob.get("/").await.text();
    assert!(!home.contains(&session));
    let workspaces = bob.get("/workspaces").await.text();
    assert!(!workspaces.contains(&ws));
}

/// `default` names each user's own default session: a user whose `default` is a session of
/// their own never reads, through `default` in an artifact's id or path, an artifact of the
/// session another user owns under that name; and their own calls' outputs show under it.
#[tokio::test]
async fn another_users_default_never_reaches_the_artifacts_of_the_first_default() {
    let (server, http) = server().await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(Some("/ana")).await;
    let hers = ana
        .upload(
            &ws,
            "tool_output",
            "default",
            "o.txt",
            "text/plain",
            b"ana's secret",
        )
        .await;
    assert!(hers.starts_with("default."), "{hers}");
    let bob_token = server.create_token("bob");
    let bob_api = Api::new(http, &bob_token);
    let bob_ws = bob_api.workspace(Some("/bob")).await;
    bob_api
        .upload(
            &bob_ws,
            "tool_output",
            "default",
            "b.txt",
            "text/plain",
            b"bob's",
        )
        .await;
    let mut bob = Browser::new(http);
    bob.sign_in(&bob_token).await;
    for path in [
        format!("/api/v1/sessions/default/artifacts/{hers}"),
        format!("/api/v1/workspaces/{bob_ws}/artifacts/{hers}"),
    ] {
        let answer = bob_api.get(&path).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        assert!(!answer.text().contains("secret"), "{path}");
    }
    let path = format!("/sessions/default/artifacts/{hers}");
    let answer = bob.get(&path).await;
    assert_eq!(answer.status, 404, "{path}: {}", answer.text());
    assert!(!answer.text().contains("secret"), "{path}");
    // His own call's output, under his `default`.
    let agent = monad_tests::connect_agent(&server.client_config_with(&bob_token)).await;
    ok(call_in(
        &agent,
        Some("default"),
        "write_file",
        json!({"path": "his.txt", "content": "bob's own output\n"}),
    )
    .await);
    // The recorder stores it in the background.
    let call = monad_tests::within(monad_tests::STEP, "his call's output listed", async {
        loop {
            let listed = bob_api
                .get("/api/v1/sessions/default/artifacts")
                .await
                .json();
            let call = listed["artifacts"]
                .as_array()
                .and_then(|all| all.iter().find_map(|a| a["callId"].as_str()))
                .map(str::to_owned);
            if let Some(call) = call {
                return call;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let page = bob.get(&format!("/sessions/default/calls/{call}")).await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains("his.txt"), "{}", page.text());
    assert!(!page.text().contains("secret"));
}

/// Markup that would run if any of it reached a page unescaped.
const XSS: &[&str] = &[
    "<script>document.body.dataset.pwned='script'</script>",
    "<img src=x onerror=\"document.body.dataset.pwned='img'\">",
    "[click](javascript:document.body.dataset.pwned='link')",
    "<a href=\"javascript:alert(1)\">a</a>",
    "<svg onload=\"document.body.dataset.pwned='svg'\"></svg>",
    "\"><script>document.body.dataset.pwned='attr'</script>",
    "<iframe srcdoc=\"<script>parent.document.body.dataset.pwned='frame'</script>\"></iframe>",
];

/// A session full of the corpus: history, file names of calls and artifacts, artifact content.
pub async fn hostile_session(server: &monad_tests::TestServer, api: &Api) -> String {
    let session = new_session();
    let ws = api.workspace(Some("/hostile")).await;
    let mut messages: Vec<(&str, &str)> = Vec::new();
    for x in XSS {
        messages.push(("user", x));
        messages.push(("assistant", x));
    }
    let snap = api.snapshot(&ws, &session, "t1", &messages).await;
    assert_eq!(snap.status, 201, "{}", snap.text());
    for x in XSS {
        api.upload(&ws, "tool_output", &session, x, "text/html", x.as_bytes())
            .await;
    }
    let agent = server.agent().await;
    for (i, name) in [
        "<img src=x onerror=alert(1)>.txt",
        "<script>alert(2)<\\script>.md",
    ]
    .iter()
    .enumerate()
    {
        ok(call_in(
            &agent,
            Some(&session),
            "write_file",
            json!({"path": name, "content": format!("{}\n", XSS[i])}),
        )
        .await);
    }
    server.audit_lines(&session, 2).await;
    session
}

#[tokio::test]
async fn markup_in_history_file_names_and_artifacts_comes_out_inert() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let session = hostile_session(&server, &api).await;
    let mut browser = Browser::new(http);
    browser.sign_in(&server.token).await;
    let page = browser.get(&format!("/sessions/{session}")).await;
    assert_eq!(page.status, 200);
    let mut html = page.text();
    let calls = browser
        .get(&format!("/sessions/{session}/calls?from=0"))
        .await
        .text();
    // Each decision is styled by its class: one `class` attribute (a second is ignored).
    assert!(calls.contains(r#"class="badge "#), "{calls}");
    assert!(!calls.contains(r#"class="badge" class="#), "{calls}");
    html.push_str(&calls);
    // The diffs of the calls, as the timeline loads them.
    let audit = api
        .get(&format!("/api/v1/sessions/{session}/audit"))
        .await
        .json();
    for record in audit["records"].as_array().unwrap() {
        let call = browser
            .get(&format!(
                "/sessions/{session}/calls/{}",
                record["callId"].as_str().unwrap()
            ))
            .await;
        html.push_str(&call.text());
    }
    for bad in [
        "<script>document",
        "<script>alert",
        "<img src=x",
        "<svg",
        "<iframe",
    ] {
        assert!(!html.contains(bad), "`{bad}` reached a page unescaped");
    }
    // Attributes are dangerous only inside a tag; as escaped text they are harmless.
    for attribute in [
        "href=\"javascript:",
        "href=javascript:",
        "onerror=",
        "onload=",
        "srcdoc=",
    ] {
        assert!(
            !inside_tag(&html.to_lowercase(), attribute),
            "`{attribute}` is an attribute of a tag on the page"
        );
    }
    assert!(
        html.contains("&lt;script&gt;"),
        "the text is still shown, escaped"
    );
    // Artifacts of any content type are downloads that cannot run in this site.
    let list = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    let html_artifact = list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["contentType"] == "text/html")
        .unwrap()["artifactId"]
        .as_str()
        .unwrap()
        .to_owned();
    let download = browser
        .get(&format!("/sessions/{session}/artifacts/{html_artifact}"))
        .await;
    assert_eq!(download.status, 200);
    assert!(
        download
            .header("content-security-policy")
            .contains("sandbox")
    );
    assert!(
        download
            .header("content-disposition")
            .starts_with("attachment")
    );
    assert_eq!(download.header("x-content-type-options"), "nosniff");
    assert!(!download.header("content-disposition").contains('<'));
}

/// Whether `needle` occurs inside a tag of `html` as markup (an attribute name), not as text
/// and not inside a quoted attribute value: a small scanner of tags and their quotes.
fn inside_tag(html: &str, needle: &str) -> bool {
    #[derive(PartialEq)]
    enum At {
        Text,
        Tag,
        Quoted(u8),
    }
    let bytes = html.as_bytes();
    let mut at = At::Text;
    for i in 0..bytes.len() {
        match (&at, bytes[i]) {
            (At::Text, b'<') => at = At::Tag,
            (At::Tag, b'>') => at = At::Text,
            (At::Tag, q @ (b'"' | b'\'')) => at = At::Quoted(q),
            (At::Quoted(q), b) if b == *q => at = At::Tag,
            (At::Tag, _) if html[i..].starts_with(needle) => return true,
            _ => {}
        }
    }
    false
}

#[tokio::test]
async fn a_session_exports_as_its_markdown() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let session = new_session();
    api.snapshot(
        &ws,
        &session,
        "t",
        &[("user", "What is 2+2?"), ("assistant", "4")],
    )
    .await;
    let mut browser = Browser::new(http);
    browser.sign_in(&server.token).await;
    let export = browser.get(&format!("/sessions/{session}/export.md")).await;
    assert_eq!(export.status, 200);
    assert!(export.header("content-type").starts_with("text/markdown"));
    assert_eq!(export.header("cache-control"), "no-store");
    let text = export.text();
    assert!(text.starts_with("---\n"), "{text}");
    assert!(text.contains("## User\n\nWhat is 2+2?"), "{text}");
    assert!(text.contains("## Assistant\n\n4"), "{text}");
}

#[tokio::test]
async fn the_session_list_pages_with_more_rows_and_searches_the_conversations() {
    let (server, http) = server().await;
    let made = super::many_sessions(&server, "admin", 120);
    let (needle, browser) = flux_conversation(&server, http).await;
    let rows = |html: &str| html.matches("class=\"row session\"").count();
    let mut html = browser.get("/").await.text();
    assert_eq!(rows(&html), 50);
    let mut seen = rows(&html);
    // Follow the "More sessions" button, as htmx does, to the end.
    while let Some(at) = html.find("hx-get=\"/sessions/rows?") {
        let start = at + "hx-get=\"".len();
        let url = html[start..start + html[start..].find('"').unwrap()].replace("&amp;", "&");
        html = browser.get(&url).await.text();
        seen += rows(&html);
    }
    assert_eq!(seen, made.len() + 1);

    let found = browser.get("/?q=flux+capacitor").await.text();
    assert_eq!(rows(&found), 1, "{found}");
    assert!(found.contains(&needle));
    let none = browser.get("/?q=nowhere+to+be+found").await.text();
    assert_eq!(rows(&none), 0);
    // Another user's conversations are not searched.
    let mut bob = Browser::new(http);
    bob.sign_in(&server.create_token("bob")).await;
    assert_eq!(rows(&bob.get("/?q=flux").await.text()), 0);
}

#[tokio::test]
async fn a_request_for_calls_answers_one_page_of_rows_with_their_targets_cut() {
    use monad_server::http::pages::CALLS_SHOWN;
    let (server, http) = server().await;
    let session = super::many_sessions(&server, "admin", 1).remove(0);
    // A long history of commands with long command lines (the audit log keeps 64 KiB of each).
    let total = 3 * CALLS_SHOWN + 7;
    audit_calls(&server, &session, total, |i| {
        format!("echo {i} {}", "x".repeat(60 * 1024))
    });
    let mut browser = Browser::new(http);
    browser.sign_in(&server.token).await;
    let rows = |html: &str| html.matches("data-call=\"call-").count();
    let limit = 2 * CALLS_SHOWN * (4096 + 512);

    // The live tail from the start: one page, then a tail that continues after it and says
    // more are there.
    let tail = browser
        .get(&format!("/sessions/{session}/calls?from=0"))
        .await;
    assert_eq!(tail.status, 200);
    let html = tail.text();
    assert_eq!(rows(&html), CALLS_SHOWN);
    assert!(html.len() < limit, "{} bytes", html.len());
    assert!(html.contains("bytes more)"), "the target is cut");
    assert!(
        html.contains(&format!("calls?from={CALLS_SHOWN}\"")) && html.contains("data-more"),
        "the tail continues"
    );
    // Its last page says no more.
    let last = browser
        .get(&format!(
            "/sessions/{session}/calls?from={}",
            3 * CALLS_SHOWN
        ))
        .await
        .text();
    assert_eq!(rows(&last), 7);
    assert!(!last.contains("data-more"), "{last}");

    // Earlier calls asked for all at once: the last page before `to`, and a button for the
    // rest.
    let earlier = browser
        .get(&format!("/sessions/{session}/calls?from=0&to={total}"))
        .await
        .text();
    assert_eq!(rows(&earlier), CALLS_SHOWN);
    assert!(earlier.len() < limit, "{} bytes", earlier.len());
    assert!(earlier.contains(&format!("call-{:04}", total - 1)));
    assert!(earlier.contains(&format!(
        "calls?from={}&amp;to={}",
        total - 2 * CALLS_SHOWN,
        total - CALLS_SHOWN
    )));

    // The session page shows the latest page, cut the same way.
    let page = browser.get(&format!("/sessions/{session}")).await.text();
    assert_eq!(rows(&page), CALLS_SHOWN);
    assert!(page.len() < limit, "{} bytes", page.len());
}

#[tokio::test]
async fn a_search_is_bounded_in_its_words_and_one_at_a_time_per_user() {
    use monad_server::http::pages::{MAX_QUERY_BYTES, MAX_QUERY_WORDS};
    let (server, http) = server().await;
    let (_, browser) = flux_conversation(&server, http).await;
    let rows = |html: &str| html.matches("class=\"row session\"").count();
    // The same word many times over is one word.
    let repeated = vec!["flux"; 50].join("+");
    let found = browser.get(&format!("/?q={repeated}")).await;
    assert_eq!(found.status, 200, "{}", found.text());
    assert_eq!(rows(&found.text()), 1);
    // Too long, or too many different words: refused, saying why.
    let long = browser
        .get(&format!("/?q={}", "f".repeat(MAX_QUERY_BYTES + 1)))
        .await;
    assert_eq!(long.status, 400);
    assert!(long.text().contains("at most 256 bytes"), "{}", long.text());
    let many: Vec<String> = (0..=MAX_QUERY_WORDS).map(|i| format!("w{i}")).collect();
    let many = browser.get(&format!("/?q={}", many.join("+"))).await;
    assert_eq!(many.status, 400);
    assert!(many.text().contains("different words"), "{}", many.text());
    // One search of a user's at a time (the second would read everything again beside it);
    // another user's searches are theirs.
    let (locked, release) = {
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let held = server.state().searching.of("admin");
        std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        (locked, release)
    };
    locked.recv().unwrap();
    let second = browser.get("/?q=flux").await;
    assert_eq!(second.status, 429, "{}", second.text());
    assert!(second.text().contains("a search of yours is running"));
    let rows_page = browser.get("/sessions/rows?q=flux").await;
    assert_eq!(rows_page.status, 429);
    let mut bob = Browser::new(http);
    bob.sign_in(&server.create_token("bob")).await;
    assert_eq!(bob.get("/?q=flux").await.status, 200);
    drop(release);
    within(STEP, "the search to be free again", async {
        while browser.get("/?q=flux").await.status == 429 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(rows(&browser.get("/?q=flux").await.text()), 1);
}

/// A page of calls ends past the lines it read, readable or not: a store that leaves out a
/// line it cannot read (PostgreSQL, a record a newer host wrote) must not make the live tail
/// ask for the same page again and again.
#[tokio::test]
async fn the_calls_tail_moves_past_records_the_store_cannot_read_on_postgresql() {
    use monad_server::http::pages::CALLS_SHOWN;
    let Some(pg) = super::super::pg_store::Pg::alone(
        "the_calls_tail_moves_past_records_the_store_cannot_read",
    ) else {
        return;
    };
    let url = pg.url.clone();
    let (server, http) = super::server_on(Some(pg)).await;
    let session = super::many_sessions(&server, "admin", 1).remove(0);
    let total = 2 * CALLS_SHOWN + 5;
    audit_calls(&server, &session, total, |i| format!("f{i}.txt"));
    // Three lines of the first page, and the whole second page, unreadable.
    super::super::pg_store::psql(
        &url,
        &format!(
            "UPDATE audit SET record = 'not a record' WHERE session_id = '{session}' AND seq IN \
             ((SELECT seq FROM audit WHERE session_id = '{session}' ORDER BY seq \
               OFFSET {CALLS_SHOWN} LIMIT {CALLS_SHOWN}) \
              UNION ALL (SELECT seq FROM audit WHERE session_id = '{session}' \
               ORDER BY seq LIMIT 3))"
        ),
    );
    let mut browser = Browser::new(http);
    browser.sign_in(&server.token).await;
    let rows = |html: &str| html.matches("data-call=\"call-").count();
    let tail = |html: &str| html[html.find("id=\"tail\"").unwrap_or(0)..].to_owned();
    let first = browser
        .get(&format!("/sessions/{session}/calls?from=0"))
        .await
        .text();
    assert_eq!(rows(&first), CALLS_SHOWN - 3);
    assert!(
        first.contains(&format!("calls?from={CALLS_SHOWN}\"")),
        "{first}"
    );
    let second = browser
        .get(&format!("/sessions/{session}/calls?from={CALLS_SHOWN}"))
        .await
        .text();
    assert_eq!(rows(&second), 0);
    assert!(
        second.contains(&format!("calls?from={}\"", 2 * CALLS_SHOWN))
            && second.contains("data-more"),
        "{}",
        tail(&second)
    );
    let last = browser
        .get(&format!(
            "/sessions/{session}/calls?from={}",
            2 * CALLS_SHOWN
        ))
        .await
        .text();
    assert_eq!(rows(&last), 5);
    assert!(last.contains(&format!("calls?from={total}\"")) && !last.contains("data-more"));
}

/// Writes `n` calls' audit records (`call-0000` on, `target(i)` each) into `session`, straight
/// in the store, as a long history would have left them.
fn audit_calls(
    server: &monad_tests::TestServer,
    session: &str,
    n: usize,
    target: impl Fn(usize) -> String,
) {
    use monad_server::store::{AuditDecision, AuditOutcome, AuditRecord, Decider};
    let records: Vec<AuditRecord> = (0..n)
        .map(|i| AuditRecord {
            time: "2026-01-01T00:00:00Z".to_owned(),
            call_id: format!("call-{i:04}"),
            tool: "run_command".to_owned(),
            workspace: None,
            target: target(i),
            decision: AuditDecision::Allowed,
            decided_by: Decider::Trust,
            outcome: AuditOutcome::Ok,
            duration_ms: 1,
        })
        .collect();
    server
        .state()
        .registry
        .store()
        .audit(session, &records)
        .expect("records written");
}

/// A session of the admin's whose conversation asks where the Flux Capacitor is documented, and
/// a browser signed in as the admin.
async fn flux_conversation(
    server: &monad_tests::TestServer,
    http: SocketAddr,
) -> (String, Browser) {
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let needle = new_session();
    api.snapshot(
        &ws,
        &needle,
        "t",
        &[("user", "Where is the Flux Capacitor documented?")],
    )
    .await;
    let mut browser = Browser::new(http);
    browser.sign_in(&server.token).await;
    (needle, browser)
}
