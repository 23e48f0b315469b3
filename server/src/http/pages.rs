//! The web view: server-rendered pages (maud, escaped by default) of a signed-in user's
//! sessions, conversations, tool calls, diffs, artifacts and workspaces, with htmx for the
//! parts that load later (a call's output, more rows) and the live timeline
//! (`assets/app.js` follows the session's events).
//!
//! Every page is sent with a Content-Security-Policy that allows scripts, styles and requests
//! from this server only and no inline script, so even markup that slipped through could not
//! run; text from users and agents is escaped by maud, and conversation Markdown goes through
//! [`super::markdown`].

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, Query, State as Shared};
use axum::handler::Handler;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;

use super::api::{self, AuditEntry, SessionsPage};
use super::signin::{PageUser, clear_cookie, same_site, set_cookie};
use super::{HttpError, Web, blocking_held, owned_record, owned_session, user_slot};
use crate::store::{ArtifactKind, ArtifactMeta};

/// Tool calls shown at first on a session page (the latest); earlier ones load on request.
pub const CALLS_SHOWN: usize = 100;
/// Sessions per page of the session list.
pub const SESSIONS_SHOWN: usize = 50;

/// The longest body of the sign-in and sign-out forms (a token, a form token). Signing in comes
/// before any user is known, so nothing counts what its body holds: axum's own limit (2 MB) let
/// every unauthenticated connection make the server hold that much.
const FORM_MAX_BYTES: usize = 4096;

/// The web view's routes.
pub fn routes() -> Router<Arc<Web>> {
    Router::new()
        .route("/", get(sessions))
        .route(
            "/login",
            get(login_form).post(login.layer(DefaultBodyLimit::max(FORM_MAX_BYTES))),
        )
        .route(
            "/logout",
            post(logout.layer(DefaultBodyLimit::max(FORM_MAX_BYTES))),
        )
        .route("/sessions/rows", get(session_rows))
        .route("/sessions/{id}", get(session))
        .route("/sessions/{id}/conversation", get(conversation))
        .route("/sessions/{id}/calls", get(calls))
        .route("/sessions/{id}/calls/{call}", get(call))
        .route("/sessions/{id}/events", get(events))
        .route("/sessions/{id}/export.md", get(export))
        .route("/sessions/{id}/artifacts/{artifact}", get(artifact))
        .route("/workspaces", get(workspaces))
        .route("/workspaces/{id}", get(workspace))
        .route("/assets/{name}", get(super::assets::serve))
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// An HTML answer with the view's security headers.
fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: with it, browsers send `Origin: null` on this site's own forms.
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A whole page: the top bar (with sign-out when signed in) and `body`.
fn layout(title: &str, who: Option<(&str, &str)>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // No inline styles from htmx (the CSP forbids them), no eval, no scripts in
                // swapped content.
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false,"selfRequestsOnly":true}"#;
                title { (title) " · Monad" }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/htmx.min.js" {}
                script src="/assets/app.js" defer {}
            }
            body {
                header.top {
                    span.brand { "Monad" }
                    @if let Some((user, form_token)) = who {
                        nav {
                            a href="/" { "Sessions" }
                            a href="/workspaces" { "Workspaces" }
                        }
                        form method="post" action="/logout" {
                            span.who { (user) " " }
                            input type="hidden" name="formToken" value=(form_token);
                            button type="submit" id="signout" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn error_page(e: &HttpError) -> Response {
    respond(
        e.status,
        layout(
            "Error",
            None,
            html! {
                div.card {
                    h1 { (e.status.as_u16()) " " (e.status.canonical_reason().unwrap_or("")) }
                    p { (e.message) }
                    p { a href="/" { "Back to your sessions" } }
                }
            },
        ),
    )
}

/// Errors of a page handler, shown as a page.
struct PageError(HttpError);

impl From<HttpError> for PageError {
    fn from(e: HttpError) -> PageError {
        PageError(e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        error_page(&self.0)
    }
}

type PageResult = Result<Response, PageError>;

// ---------------------------------------------------------------------------------------------
// Sign-in.

fn login_page(status: StatusCode, message: Option<&str>) -> Response {
    respond(
        status,
        layout(
            "Sign in",
            None,
            html! {
                div.card.login {
                    h1 { "Sign in" }
                    p.muted { "With a token from " code { "monad-server token create" } "." }
                    @if let Some(m) = message { p.error #login-error { (m) } }
                    form method="post" action="/login" {
                        label for="token" { "Token" }
                        input #token type="password" name="token" autocomplete="current-password" autofocus;
                        button.primary type="submit" id="signin" { "Sign in" }
                    }
                }
            },
        ),
    )
}

async fn login_form() -> Response {
    login_page(StatusCode::OK, None)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

fn cross_site() -> Response {
    error_page(&HttpError {
        status: StatusCode::FORBIDDEN,
        code: "forbidden",
        message: "this form may only be sent from this server's own pages".into(),
    })
}

async fn login(
    Shared(web): Shared<Arc<Web>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !same_site(&headers) {
        return cross_site();
    }
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return login_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("The form was too long for a token."),
            );
        }
        Err(_) => {
            return login_page(StatusCode::BAD_REQUEST, Some("The form was not complete."));
        }
    };
    let token = form.token.trim().to_owned();
    match web.state.tokens.verify_off(&token).await {
        Ok(Some(user)) => {
            let signin = web.signins.sign_in(&user, &token);
            let mut response = Redirect::to("/").into_response();
            *response.status_mut() = StatusCode::SEE_OTHER;
            if let Ok(v) = HeaderValue::from_str(&set_cookie(&headers, &signin.id)) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Ok(None) => login_page(
            StatusCode::UNAUTHORIZED,
            Some("That token is unknown or revoked."),
        ),
        Err(e) => error_page(&HttpError::internal(e)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogoutForm {
    form_token: String,
}

async fn logout(
    Shared(web): Shared<Arc<Web>>,
    headers: HeaderMap,
    user: PageUser,
    form: Result<Form<LogoutForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if let Err(rejection) = &form
        && rejection.status() == StatusCode::PAYLOAD_TOO_LARGE
    {
        return error_page(&HttpError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "payload_too_large",
            message: "the form was too long for a form token".into(),
        });
    }
    let token_ok = form
        .as_ref()
        .is_ok_and(|Form(f)| user.form_token_ok(&web, &f.form_token));
    if !same_site(&headers) || !token_ok {
        return cross_site();
    }
    web.signins.sign_out(&user.signin);
    let mut response = Redirect::to("/login").into_response();
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(&clear_cookie(&headers)) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

// ---------------------------------------------------------------------------------------------
// Sessions.

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    q: Option<String>,
    next: Option<String>,
}

/// Longest search, in bytes.
pub const MAX_QUERY_BYTES: usize = 256;

/// Most distinct words of a search (each is looked for in every conversation read).
pub const MAX_QUERY_WORDS: usize = 8;

/// The search `q` as it is run: its distinct words, lower-cased, in their first order; a
/// `400` past [`MAX_QUERY_BYTES`] or [`MAX_QUERY_WORDS`].
fn search_words(q: &str) -> Result<String, HttpError> {
    if q.len() > MAX_QUERY_BYTES {
        return Err(HttpError::bad(format!(
            "a search has at most {MAX_QUERY_BYTES} bytes; this one has {}",
            q.len()
        )));
    }
    let mut words: Vec<String> = Vec::new();
    for word in q.split_whitespace().map(str::to_lowercase) {
        if !words.contains(&word) {
            words.push(word);
        }
    }
    if words.len() > MAX_QUERY_WORDS {
        return Err(HttpError::bad(format!(
            "a search has at most {MAX_QUERY_WORDS} different words; this one has {}",
            words.len()
        )));
    }
    Ok(words.join(" "))
}

/// A page of the session list: all sessions, or those whose conversation matches `q`.
fn list(
    web: &Web,
    user: &str,
    q: Option<&str>,
    next: Option<&str>,
) -> Result<SessionsPage, HttpError> {
    match q.map(str::trim).filter(|q| !q.is_empty()) {
        None => api::sessions_page(web, user, SESSIONS_SHOWN, next),
        Some(q) => {
            let q = search_words(q)?;
            let q = q.as_str();
            // One search of a user's at a time (`State::searching`): `429` for another.
            let searching = web.state.searching.of(user);
            let Ok(_searching) = searching.try_lock() else {
                return Err(HttpError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    code: "limit_exceeded",
                    message: "a search of yours is running; wait for it to finish, then search \
                              again"
                        .into(),
                });
            };
            let listing = format!("search:{q}");
            let offset = api::page_offset(web, user, &listing, next)?;
            let store = web.state.registry.store();
            let (ids, more) = store
                .search_page(user, q, offset, SESSIONS_SHOWN)
                .map_err(HttpError::store)?;
            let end = offset + ids.len();
            let sessions = ids
                .iter()
                .filter_map(|id| store.load(id).ok().flatten())
                .map(|m| api::SessionSummary {
                    task_count: store.audit_count(&m.id).unwrap_or(0) as u64,
                    session_id: m.id,
                    name: m.name,
                    created_at: m.created_at,
                    last_task_at: m.last_active,
                })
                .collect();
            Ok(SessionsPage {
                sessions,
                next_token: more.then(|| web.signer.sign(user, &listing, &end.to_string())),
            })
        }
    }
}

fn short_time(rfc3339: &str) -> String {
    rfc3339.get(..19).unwrap_or(rfc3339).replace('T', " ")
}

fn session_rows_markup(page: &SessionsPage, q: Option<&str>) -> Markup {
    html! {
        @for s in &page.sessions {
            div.row.session {
                a.mono href={ "/sessions/" (s.session_id) } {
                    @if let Some(name) = &s.name { (name) } @else { (s.session_id) }
                }
                span { (short_time(&s.created_at)) }
                span { (short_time(&s.last_task_at)) }
                span { (s.task_count) }
            }
        }
        @if let Some(next) = &page.next_token {
            @let url = format!("/sessions/rows?next={}&q={}", urlencode(next), urlencode(q.unwrap_or("")));
            div.more {
                button hx-get=(url) hx-target="closest .more" hx-swap="outerHTML" { "More sessions" }
            }
        }
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn sessions(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Query(query): Query<ListQuery>,
) -> PageResult {
    let w = web.clone();
    let u = user.user.clone();
    let q = query.q.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let page = blocking_held(slot, move || {
        list(&w, &u, q.as_deref(), query.next.as_deref())
    })
    .await?;
    let form_token = user.form_token(&web);
    let q = query.q.unwrap_or_default();
    Ok(respond(
        StatusCode::OK,
        layout(
            "Sessions",
            Some((&user.user, &form_token)),
            html! {
                h1 { "Sessions" }
                form.search method="get" action="/" {
                    input type="search" name="q" value=(q) placeholder="Search the conversations";
                    button type="submit" { "Search" }
                }
                div.list #sessions {
                    div.row.head { span { "Session" } span { "Created" } span { "Last activity" } span { "Calls" } }
                    (session_rows_markup(&page, Some(&q)))
                }
                @if page.sessions.is_empty() { p.muted { "No sessions." } }
            },
        ),
    ))
}

async fn session_rows(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Query(query): Query<ListQuery>,
) -> PageResult {
    let q = query.q.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let page = blocking_held(slot, move || {
        list(&web, &user.user, q.as_deref(), query.next.as_deref())
    })
    .await?;
    Ok(respond(
        StatusCode::OK,
        session_rows_markup(&page, query.q.as_deref()),
    ))
}

fn conversation_markup(history: &api::HistoryView) -> Markup {
    html! {
        @if history.messages.is_empty() { p.muted { "No messages yet." } }
        @for m in &history.messages {
            @let role = match m.role { api::MessageRole::User => "user", api::MessageRole::Assistant => "assistant", api::MessageRole::System => "system" };
            div class={ "msg " (role) } {
                div.role { (role) }
                (PreEscaped(super::markdown::to_html(&m.content)))
            }
        }
    }
}

/// One tool call's row: the summary, and its output and diff loaded when it is opened.
fn call_markup(session: &str, c: &AuditEntry, has_diff: bool) -> Markup {
    let outcome_class = if c.outcome == "ok" { "ok" } else { "failed" };
    html! {
        details.call data-call=(c.call_id) hx-get={ "/sessions/" (session) "/calls/" (c.call_id) }
            hx-trigger="toggle once" hx-target="find .body" {
            summary {
                span.mono.muted { (c.time.get(11..19).unwrap_or(&c.time)) }
                span.mono { (c.tool) }
                span { (c.workspace.as_deref().unwrap_or("—")) }
                @let target = crate::feed::event_target(&c.target);
                span.mono.target title=(target) { (target) }
                span { span class={ "badge " (c.decision) } { (c.decision) } " " span.muted { (c.decided_by) } }
                span.mono { (c.duration_ms) " ms" }
                span class=(outcome_class) { (c.outcome) @if has_diff { " " span.badge { "diff" } } }
            }
            div.body { span.muted { "Loading…" } }
        }
    }
}

/// Where a page of the audit log that asked for `limit` lines from `from`, of `total`, ends:
/// past the lines it read, whether or not the store could read each (one it could not is left
/// out of `calls`, and must not be asked for again and again).
fn page_end(from: usize, limit: usize, total: usize) -> usize {
    from + limit.min(total.saturating_sub(from))
}

/// The calls of a session up to `next`, and what follows them: the live tail (when `tail`),
/// which refreshes to the calls from `next` on, and says when more than one page of them is
/// already there (`data-more`: the page asks again at once).
fn calls_markup(
    session: &str,
    calls: &[AuditEntry],
    next: usize,
    total: usize,
    diffs: &std::collections::HashSet<String>,
    tail: bool,
) -> Markup {
    html! {
        @for c in calls { (call_markup(session, c, diffs.contains(&c.call_id))) }
        @if tail {
            div #tail data-src={ "/sessions/" (session) "/calls?from=" (next) } data-total=(total)
                data-more=[(next < total).then_some("1")] {}
        }
    }
}

/// The calls of `records` (of session `session`) that have a diff kept: their artifacts alone
/// are read, never every artifact's metadata.
fn diff_calls(
    state: &crate::state::State,
    session: &str,
    records: &[crate::store::AuditRecord],
) -> Result<std::collections::HashSet<String>, HttpError> {
    let calls = records.iter().map(|r| r.call_id.clone()).collect();
    let artifacts =
        HttpError::store_or_nothing(state.registry.store().call_artifacts(session, &calls))?;
    Ok(artifacts
        .into_iter()
        .filter(|a| a.kind == ArtifactKind::FileDiff)
        .filter_map(|a| a.call_id)
        .collect())
}

/// How many of a session's latest artifacts its page shows.
const ARTIFACTS_SHOWN: usize = 20;

struct SessionData {
    view: api::SessionView,
    history: api::HistoryView,
    calls: Vec<AuditEntry>,
    start: usize,
    /// Where the calls shown end (see [`page_end`]).
    end: usize,
    total: usize,
    /// The latest artifacts, the latest first.
    artifacts: Vec<ArtifactMeta>,
    diffs: std::collections::HashSet<String>,
}

fn session_data(web: &Web, user: &str, id: &str) -> Result<SessionData, HttpError> {
    let state = &web.state;
    let view = api::session_view(state, user, id)?;
    let history = api::history_view(state, user, &view.session_id)?;
    let store = state.registry.store();
    let total = store
        .audit_count(&view.session_id)
        .map_err(HttpError::store)?;
    let start = total.saturating_sub(CALLS_SHOWN);
    let (records, total) = store
        .audit_page(&view.session_id, start, CALLS_SHOWN)
        .map_err(HttpError::store)?;
    let diffs = diff_calls(state, &view.session_id, &records)?;
    let mut artifacts =
        HttpError::store_or_nothing(store.latest_artifacts(&view.session_id, ARTIFACTS_SHOWN))?;
    artifacts.reverse();
    Ok(SessionData {
        calls: records.iter().map(AuditEntry::of).collect(),
        start,
        end: page_end(start, CALLS_SHOWN, total),
        total,
        view,
        history,
        artifacts,
        diffs,
    })
}

async fn session(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
) -> PageResult {
    let w = web.clone();
    let u = user.user.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let data = blocking_held(slot, move || session_data(&w, &u, &id)).await?;
    let form_token = user.form_token(&web);
    let sid = data.view.session_id.clone();
    let diffs = &data.diffs;
    let title = data.view.name.clone().unwrap_or_else(|| sid.clone());
    Ok(respond(
        StatusCode::OK,
        layout(
            &title,
            Some((&user.user, &form_token)),
            html! {
                div data-events={ "/sessions/" (sid) "/events" } {
                    h1 { "Session " span.mono { (title) } }
                    div.actions {
                        a.button href={ "/sessions/" (sid) "/export.md" } id="export" { "Export as Markdown" }
                        span.live { "live" }
                        span.muted { "created " (short_time(&data.view.created_at)) " · last activity " (short_time(&data.view.last_task_at)) }
                    }
                    div.grid2 {
                        div.card {
                            h2 { "Workspaces" }
                            table.workspaces {
                                @for w in &data.view.workspaces {
                                    tr {
                                        td { strong { (w.name) } }
                                        td.mono { (w.uri) }
                                        td { (w.trust) }
                                        td { @if w.online { "online" } @else { span.muted { "offline" } } }
                                    }
                                }
                            }
                            @if !data.view.workspace_ids.is_empty() {
                                p { "Records: "
                                    @for r in &data.view.workspace_ids { a.mono href={ "/workspaces/" (r) } { (r.get(..8).unwrap_or(r)) } " " }
                                }
                            }
                        }
                        div.card {
                            h2 { "Artifacts" }
                            @if data.artifacts.is_empty() { p.muted { "None." } }
                            ul {
                                @for a in &data.artifacts {
                                    @let v = api::artifact_view(a);
                                    li {
                                        a.mono href={ "/sessions/" (sid) "/artifacts/" (v.artifact_id) } {
                                            (v.artifact_name.clone().or(v.tool.clone()).unwrap_or_else(|| v.artifact_type.clone()))
                                        }
                                        " " span.muted { (v.artifact_type) " · " (v.size) " B" }
                                    }
                                }
                            }
                        }
                    }
                    h2 { "Conversation" }
                    div.conversation #conversation data-src={ "/sessions/" (sid) "/conversation" } {
                        (conversation_markup(&data.history))
                    }
                    h2 { "Tool calls " span.muted { "(" span #call-count { (data.total) } ")" } }
                    div #timeline {
                        @if data.start > 0 {
                            @let from = data.start.saturating_sub(CALLS_SHOWN);
                            div.more {
                                button hx-get={ "/sessions/" (sid) "/calls?from=" (from) "&to=" (data.start) }
                                    hx-target="closest .more" hx-swap="outerHTML" { "Earlier calls (" (data.start) ")" }
                            }
                        }
                        (calls_markup(&sid, &data.calls, data.end, data.total, diffs, true))
                    }
                }
            },
        ),
    ))
}

async fn conversation(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
) -> PageResult {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let history = blocking_held(slot, move || api::history_view(&state, &user.user, &id)).await?;
    Ok(respond(StatusCode::OK, conversation_markup(&history)))
}

#[derive(Debug, Deserialize)]
struct CallsQuery {
    from: usize,
    to: Option<usize>,
}

async fn calls(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
    q: Result<Query<CallsQuery>, axum::extract::rejection::QueryRejection>,
) -> PageResult {
    let Ok(Query(q)) = q else {
        return Err(HttpError::bad("`from` must be a number").into());
    };
    // At most one page of rows per request, whatever was asked: a row holds up to 64 KiB of
    // target, so ten thousand of them would hold gigabytes for one request. Earlier calls are
    // the last page before `to`; the live tail the first page from `from` (it says when more
    // follow).
    let from =
        q.to.map_or(q.from, |to| q.from.max(to.saturating_sub(CALLS_SHOWN)));
    let limit = q.to.map_or(CALLS_SHOWN, |to| to.saturating_sub(from));
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let (sid, records, total, diffs) = blocking_held(slot, move || {
        let meta = owned_session(&state, &user.user, &id)?;
        let store = state.registry.store();
        let (records, total) = store
            .audit_page(&meta.id, from, limit)
            .map_err(HttpError::store)?;
        let diffs = diff_calls(&state, &meta.id, &records)?;
        Ok((meta.id, records, total, diffs))
    })
    .await?;
    let calls: Vec<AuditEntry> = records.iter().map(AuditEntry::of).collect();
    let markup = match q.to {
        // Earlier calls: the rows, after another "earlier" button while there are more.
        Some(_) => html! {
            @if from > 0 {
                div.more {
                    button hx-get={ "/sessions/" (sid) "/calls?from=" (from.saturating_sub(CALLS_SHOWN)) "&to=" (from) }
                        hx-target="closest .more" hx-swap="outerHTML" { "Earlier calls (" (from) ")" }
                }
            }
            (calls_markup(&sid, &calls, page_end(from, limit, total), total, &diffs, false))
        },
        None => calls_markup(
            &sid,
            &calls,
            page_end(from, limit, total),
            total,
            &diffs,
            true,
        ),
    };
    Ok(respond(StatusCode::OK, markup))
}

/// A unified diff with each line coloured by what it is.
fn diff_markup(text: &str) -> Markup {
    html! {
        pre.diff {
            @for line in text.lines() {
                @let class = if line.starts_with("+++") || line.starts_with("---") { "meta" }
                    else if line.starts_with('+') { "add" }
                    else if line.starts_with('-') { "del" }
                    else if line.starts_with("@@") { "hunk" }
                    else { "ctx" };
                span class=(class) { (line) "\n" }
            }
        }
    }
}

fn artifact_body(meta: &ArtifactMeta, content: &[u8]) -> Markup {
    let text = String::from_utf8_lossy(content);
    match meta.kind {
        ArtifactKind::FileDiff => diff_markup(&text),
        ArtifactKind::ToolOutput | ArtifactKind::SessionHistory => {
            let pretty = serde_json::from_slice::<serde_json::Value>(content)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or_else(|| text.into_owned());
            html! { pre.output { (pretty) } }
        }
    }
}

async fn call(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path((id, call_id)): Path<(String, String)>,
) -> PageResult {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let (sid, found) = blocking_held(slot, move || {
        // As its owner's id: `default` is the caller's own default (see `owned_session`).
        let sid = owned_session(&state, &user.user, &id)?.id;
        let calls = std::iter::once(call_id).collect();
        let metas =
            HttpError::store_or_nothing(state.registry.store().call_artifacts(&sid, &calls))?;
        let mut found = Vec::new();
        for meta in metas {
            let (meta, content) = state
                .registry
                .store()
                .artifact(&sid, &meta.id)
                .map_err(HttpError::store)?;
            found.push((meta, content));
        }
        Ok((sid, found))
    })
    .await?;
    Ok(respond(
        StatusCode::OK,
        html! {
            @if found.is_empty() { p.muted { "No output was kept for this call." } }
            @for (meta, content) in &found {
                div.artifact {
                    span.muted { (meta.kind.as_str()) " · " (meta.size) " B"
                        @if meta.truncated { " (cut from " (meta.original_size) " B)" } " · " }
                    a href={ "/sessions/" (sid) "/artifacts/" (api::public_id(meta)) } { "download" }
                    (artifact_body(meta, content))
                }
            }
        },
    ))
}

async fn events(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
) -> PageResult {
    let state = web.state.clone();
    let owner = user.user.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let meta = blocking_held(slot, move || owned_session(&state, &owner, &id)).await?;
    let credential = super::signin::Credential::Signin(user.signin);
    Ok(api::event_stream(web, meta.id, user.user, credential).into_response())
}

async fn export(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
) -> PageResult {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let (sid, text) = blocking_held(slot, move || {
        let meta = owned_session(&state, &user.user, &id)?;
        let history = state
            .registry
            .store()
            .history(&meta.id)
            .map_err(HttpError::store)?;
        Ok((meta.id, crate::store::history::render(&history)))
    })
    .await?;
    Ok(api::attachment(
        text,
        HeaderValue::from_static("text/markdown; charset=utf-8"),
        &format!("session-{sid}.md"),
    ))
}

async fn artifact(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path((id, artifact)): Path<(String, String)>,
) -> PageResult {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let (meta, content) = blocking_held(slot, move || {
        api::owned_artifact(&state, &user.user, &artifact, Some(&id))
    })
    .await?;
    Ok(api::download(&meta, content))
}

// ---------------------------------------------------------------------------------------------
// Workspaces.

async fn workspaces(Shared(web): Shared<Arc<Web>>, user: PageUser) -> PageResult {
    let state = web.state.clone();
    let u = user.user.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let records = blocking_held(slot, move || {
        state
            .registry
            .store()
            .records(Some(&u))
            .map_err(HttpError::store)
    })
    .await?;
    let form_token = user.form_token(&web);
    Ok(respond(
        StatusCode::OK,
        layout(
            "Workspaces",
            Some((&user.user, &form_token)),
            html! {
                h1 { "Workspaces" }
                div.list {
                    div.row.head { span { "Folder" } span { "Created" } span { "Last activity" } span { "Scope" } }
                    @for r in &records {
                        @let scope = api::WorkspaceScope::of(r);
                        div.row {
                            a.mono href={ "/workspaces/" (r.id) } {
                                @if r.path.is_empty() { "general " (r.id.get(..8).unwrap_or(&r.id)) } @else { (r.uri) }
                            }
                            span { (short_time(&r.created_at)) }
                            span { (short_time(&r.last_active)) }
                            span { (if scope == api::WorkspaceScope::Local { "local" } else { "general" }) }
                        }
                    }
                }
                @if records.is_empty() { p.muted { "No workspaces yet: attach a folder with " code { "monad-client attach" } "." } }
            },
        ),
    ))
}

async fn workspace(
    Shared(web): Shared<Arc<Web>>,
    user: PageUser,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> PageResult {
    let w = web.clone();
    let u = user.user.clone();
    let slot = user_slot(&web.state, &user.user).await?;
    let (record, page) = blocking_held(slot, move || {
        let record = owned_record(&w.state, &u, &id)?;
        let page =
            api::workspace_sessions_page(&w, &u, &id, SESSIONS_SHOWN, query.next.as_deref())?;
        Ok((record, page))
    })
    .await?;
    let form_token = user.form_token(&web);
    let title = if record.path.is_empty() {
        format!("general {}", record.id)
    } else {
        record.uri.clone()
    };
    Ok(respond(
        StatusCode::OK,
        layout(
            &title,
            Some((&user.user, &form_token)),
            html! {
                h1 { "Workspace " span.mono { (title) } }
                div.list {
                    div.row.head { span { "Session" } span { "First used" } span { "Last task" } span { "Tasks" } }
                    @for s in &page.sessions {
                        div.row.session {
                            a.mono href={ "/sessions/" (s.session_id) } { @if let Some(n) = &s.name { (n) } @else { (s.session_id) } }
                            span { (short_time(&s.created_at)) }
                            span { (short_time(&s.last_task_at)) }
                            span { (s.task_count) }
                        }
                    }
                }
                @if let Some(next) = &page.next_token {
                    p.more { a href={ "/workspaces/" (record.id) "?next=" (urlencode(next)) } { "More sessions" } }
                }
            },
        ),
    ))
}
