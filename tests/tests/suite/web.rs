//! The workspace service API and the web view (issue 13), through a real HTTP client against
//! a real server on loopback, and the pages in a real headless browser.

mod api;
mod browser;
mod pages;
mod quota;

use std::net::SocketAddr;

use monad_server::store::SessionMeta;
use monad_tests::TestServer;
use serde_json::{Value, json};

/// A server with its HTTP listener on a free loopback port.
pub async fn server() -> (TestServer, SocketAddr) {
    server_with(|_| {}).await
}

/// The same, on the PostgreSQL store (with S3) when given.
pub async fn server_on(pg: Option<super::pg_store::Pg>) -> (TestServer, SocketAddr) {
    server_with(|c| {
        if let Some(pg) = &pg {
            pg.configure(c);
        }
    })
    .await
}

/// The same, with the configuration tuned by `tune` first.
pub async fn server_with(
    tune: impl FnOnce(&mut monad_server::config::ServerConfig),
) -> (TestServer, SocketAddr) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| {
        tune(c);
        c.http = Some(http);
    })
    .await;
    (server, http)
}

/// An HTTP client of the API with one user's token.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// A `400` with a JSON error whose message mentions `what`.
    pub fn assert_bad(&self, what: &str) {
        assert_eq!(self.status, 400, "{}", self.text());
        let body = self.json();
        assert_eq!(body["error"], "bad_request", "{body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(what),
            "the message should mention `{what}`: {message}"
        );
    }
}

/// A reqwest client (TLS configured explicitly: no process-wide crypto provider here), that
/// does not follow redirects, so tests see them.
pub fn http_client() -> reqwest::Client {
    monad_server::llm::http_client_builder()
        .expect("TLS set up")
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client")
}

impl Api {
    pub fn new(http: SocketAddr, token: &str) -> Api {
        Api {
            base: format!("http://{http}"),
            token: token.to_owned(),
            client: http_client(),
        }
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("the request is answered");
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("the body arrives").to_vec(),
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(self.client.delete(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.post_raw(path, body.to_string().into_bytes()).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> Answer {
        self.send(
            self.client
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// A new workspace: `local` at `path`, or `general`.
    pub async fn workspace(&self, path: Option<&str>) -> String {
        let body = match path {
            Some(p) => json!({"workspaceScope": "local", "localPath": p}),
            None => json!({"workspaceScope": "general"}),
        };
        let answer = self.post("/api/v1/workspaces", &body).await;
        assert!(
            answer.status == 201 || answer.status == 200,
            "{}",
            answer.text()
        );
        answer.json()["workspaceId"].as_str().unwrap().to_owned()
    }

    /// Uploads a `tool_output` (or `file_diff`) and returns its id.
    pub async fn upload(
        &self,
        workspace: &str,
        kind: &str,
        session: &str,
        name: &str,
        content_type: &str,
        content: &[u8],
    ) -> String {
        use base64::Engine;
        let answer = self
            .post(
                &format!("/api/v1/workspaces/{workspace}/artifacts"),
                &json!({
                    "sessionId": session,
                    "taskId": "task_001",
                    "stepId": "step_001",
                    "artifactType": kind,
                    "artifactName": name,
                    "contentType": content_type,
                    "contentBase64": base64::engine::general_purpose::STANDARD.encode(content),
                    "metadata": {"toolName": "RunCommand"},
                }),
            )
            .await;
        assert_eq!(answer.status, 201, "{}", answer.text());
        answer.json()["artifactId"].as_str().unwrap().to_owned()
    }

    /// Uploads a history snapshot of `(role, content)` messages.
    pub async fn snapshot(
        &self,
        workspace: &str,
        session: &str,
        task: &str,
        messages: &[(&str, &str)],
    ) -> Answer {
        let messages: Vec<Value> = messages
            .iter()
            .enumerate()
            .map(|(i, (role, content))| {
                json!({"messageId": format!("msg_{i}"), "role": role, "content": content,
                       "timestamp": "2026-02-21T14:00:00Z"})
            })
            .collect();
        self.post(
            &format!("/api/v1/workspaces/{workspace}/artifacts"),
            &json!({
                "sessionId": session,
                "artifactType": "session_history",
                "snapshotAfterTaskId": task,
                "snapshotAt": "2026-02-21T16:00:00Z",
                "messages": messages,
            }),
        )
        .await
    }
}

/// A fresh session id.
pub fn new_session() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Makes `n` sessions of `owner` straight in the store, with activity times that repeat (so
/// the listing's tie-break by id is exercised); returns their ids.
pub fn many_sessions(server: &TestServer, owner: &str, n: usize) -> Vec<String> {
    let store = server.state().registry.store();
    (0..n)
        .map(|i| {
            let id = new_session();
            let when = format!("2026-01-01T00:{:02}:00Z", i % 50);
            store
                .create(&SessionMeta {
                    id: id.clone(),
                    name: None,
                    owner: owner.to_owned(),
                    created_at: when.clone(),
                    last_active: when,
                    provider: None,
                    model: None,
                    focus: None,
                    folders: Vec::new(),
                })
                .expect("session created");
            id
        })
        .collect()
}

/// An approver whose answers the test gives: each question comes out of the receiver with the
/// sender of its answer (a dropped sender denies).
pub struct Gated(
    tokio::sync::mpsc::UnboundedSender<(
        monad_client::approval::ApprovalRequest,
        tokio::sync::oneshot::Sender<monad_client::approval::Decision>,
    )>,
);

/// The questions a [`Gated`] approver was asked, with the senders of their answers.
pub type Questions = tokio::sync::mpsc::UnboundedReceiver<(
    monad_client::approval::ApprovalRequest,
    tokio::sync::oneshot::Sender<monad_client::approval::Decision>,
)>;

impl Gated {
    pub fn new() -> (Gated, Questions) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Gated(tx), rx)
    }
}

impl monad_client::approval::Approver for Gated {
    fn decide(
        &self,
        request: monad_client::approval::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = monad_client::approval::Decision> + Send>>
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let _ = self.0.send((request, answer));
        Box::pin(async move {
            answered
                .await
                .unwrap_or(monad_client::approval::Decision::Deny)
        })
    }
}

/// A folder attached as `lap` (restricted) whose owner answers through the returned questions.
pub async fn gated_folder(
    server: &TestServer,
    files: &[(&str, &str)],
) -> (tempfile::TempDir, monad_tests::Attachment, Questions) {
    let dir = monad_tests::folder(files);
    let (approver, questions) = Gated::new();
    let attachment = monad_tests::Attachment::start(
        &server.client_config(),
        monad_tests::attach_options(dir.path(), "lap"),
        Some(std::sync::Arc::new(approver)),
    )
    .await;
    (dir, attachment, questions)
}
