//! The network a command gets: off (a loopback of its own), an allowlist through Monad's proxy,
//! or the host's. A real HTTP server on this machine's loopback stands for the network a
//! command must not reach unless the policy lists it.

use std::io::{Read, Write};
use std::net::TcpListener;

use monad_protocol::ErrorCode;
use monad_sandbox::{ExecPolicy, Limits, NamespacePolicy, NetworkMode};

use super::support::{Fixture, run, sh, try_run};

/// Serves HTTP on 127.0.0.1, on a thread, until the test process ends: each request's head is
/// read (its header lines given to `answer`, with the stream for its body), and `answer`'s text
/// is the body of a `200 OK`. Returns the port.
fn serve_http(answer: fn(&[(String, String)], &mut std::net::TcpStream) -> String) -> u16 {
    serve_http_on("127.0.0.1:0", answer)
}

/// [`serve_http`] on `bind`.
fn serve_http_on(
    bind: &str,
    answer: fn(&[(String, String)], &mut std::net::TcpStream) -> String,
) -> u16 {
    let listener = TcpListener::bind(bind).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let headers: Vec<(String, String)> = String::from_utf8_lossy(&head)
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .map(|(name, value)| {
                        (name.trim().to_ascii_lowercase(), value.trim().to_owned())
                    })
                    .collect();
                let body = answer(&headers, &mut stream);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// Serves `hello from the host` to every HTTP request on 127.0.0.1. Returns the port.
fn http_server() -> u16 {
    serve_http(|_, _| "hello from the host".to_owned())
}

/// Answers every HTTP request on 127.0.0.1 with the `Host` headers it came with. Returns the
/// port.
fn host_echo_server() -> u16 {
    serve_http(|headers, _| {
        let hosts: Vec<&str> = headers
            .iter()
            .filter(|(name, _)| name == "host")
            .map(|(_, value)| value.as_str())
            .collect();
        hosts.join(",")
    })
}

/// Answers every HTTP request on 127.0.0.1 with whether it read the body its `Content-Length`
/// gave, and how many `x` it held. Returns the port.
fn body_length_server() -> u16 {
    serve_http(|headers, stream| {
        let length: usize = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        let read = stream.read_exact(&mut body).is_ok();
        format!("{read} {}", body.iter().filter(|&&b| b == b'x').count())
    })
}

fn allowlist(allow: &[&str], deny: &[&str]) -> Fixture {
    Fixture::with(
        Limits::default(),
        ExecPolicy {
            network: NetworkMode::Allowlist,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
}

/// `curl` through the proxy the sandbox announces (`-x`), also for loopback names that
/// `NO_PROXY` would otherwise send around it.
fn curl(fx: &Fixture, how: &[&str], url: &str) -> monad_protocol::tools::RunCommandResult {
    let mut argv = vec!["curl", "-sS", "--max-time", "10", "--noproxy", ""];
    argv.extend_from_slice(how);
    argv.push(url);
    run(fx, &argv)
}

#[test]
fn with_the_network_off_the_hosts_loopback_is_unreachable_and_its_own_works() {
    let port = http_server();
    let fx = Fixture::new();
    let out = curl(&fx, &[], &format!("http://127.0.0.1:{port}/"));
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!out.stdout.contains("hello"), "{out:?}");
    // A server of its own on its own loopback, as a test suite starts.
    let out = sh(
        &fx,
        "python3 -m http.server --bind 127.0.0.1 8000 >/dev/null 2>&1 & \
         for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.05; done; \
         curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/",
    );
    assert_eq!(out.stdout, "200", "{out:?}");
}

/// A command that failed where commands have no network, saying it could not reach something,
/// is answered with why: its own output ("could not connect", "could not resolve host") does
/// not say. Not after one that succeeded, one whose failure says nothing of the network, nor
/// where commands have network.
#[test]
fn a_failed_command_without_network_is_told_so() {
    let port = http_server();
    let said = |out: &monad_protocol::tools::RunCommandResult| {
        let value = serde_json::to_value(out).unwrap();
        monad_protocol::render::text(monad_protocol::ToolName::RunCommand, None, &value)
            .contains("its network policy is \"off\"")
    };
    let fx = Fixture::new();
    let failed = curl(&fx, &[], "http://example.com/");
    assert!(failed.network_off && said(&failed), "{failed:?}");
    // A refused connection is not the network's doing: the workspace's own loopback works, and
    // a local service that is not running is refused there too.
    let refused = curl(&fx, &[], &format!("http://127.0.0.1:{port}/"));
    assert!(refused.network_off && !said(&refused), "{refused:?}");
    let worked = sh(&fx, "echo could not resolve host");
    assert!(worked.network_off && !said(&worked), "{worked:?}");
    // A failure that says nothing of the network (a failing test) is not sent looking there.
    let other = sh(&fx, "echo 'assertion failed' >&2; exit 1");
    assert!(other.network_off && !said(&other), "{other:?}");
    let fx = allowlist(&["example.com"], &[]);
    let failed = curl(&fx, &[], &format!("http://127.0.0.1:{port}/"));
    assert!(!failed.network_off && !said(&failed), "{failed:?}");
}

#[test]
fn the_allowlist_lets_through_only_what_it_lists() {
    let port = http_server();
    let url = format!("http://127.0.0.1:{port}/");
    let listed = allowlist(&["127.0.0.1"], &[]);
    for how in [
        &["-x", "http://127.0.0.1:3128"][..],
        &["-p", "-x", "http://127.0.0.1:3128"],
        &["--socks5-hostname", "127.0.0.1:3128"],
    ] {
        let out = curl(&listed, how, &url);
        assert_eq!(out.stdout, "hello from the host", "{how:?}: {out:?}");
        assert!(
            out.network.iter().any(|e| e.allowed && e.port == port),
            "{:?}",
            out.network
        );
    }
    // The environment points every proxy-aware tool at it.
    let out = sh(&listed, "echo $HTTPS_PROXY $ALL_PROXY");
    assert_eq!(
        out.stdout, "http://127.0.0.1:3128 socks5h://127.0.0.1:3128\n",
        "{out:?}"
    );

    let other = allowlist(&["pypi.org"], &[]);
    for how in [
        &["-x", "http://127.0.0.1:3128"][..],
        &["-p", "-x", "http://127.0.0.1:3128"],
        &["--socks5-hostname", "127.0.0.1:3128"],
    ] {
        let out = curl(&other, how, &url);
        assert!(!out.stdout.contains("hello"), "{how:?}: {out:?}");
        let refused = out
            .network
            .iter()
            .find(|e| !e.allowed)
            .unwrap_or_else(|| panic!("no refusal reported: {out:?}"));
        assert!(
            refused
                .reason
                .as_deref()
                .unwrap_or("")
                .contains("not in the allowlist"),
            "{refused:?}"
        );
    }
    // Going around the proxy goes nowhere: the namespace has no other way out.
    let out = run(
        &listed,
        &["curl", "-sS", "--max-time", "5", "--noproxy", "*", &url],
    );
    assert_ne!(out.exit_code, Some(0), "{out:?}");
}

/// Regression: bytes a client sent in the same write as its `CONNECT` head (a TLS hello sent
/// without waiting for the answer, as some clients do) were dropped.
#[test]
fn bytes_sent_with_a_connect_head_reach_the_destination() {
    let port = http_server();
    let fx = allowlist(&["127.0.0.1"], &[]);
    let script = format!(
        r#"
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
data = b""
try:
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
except socket.timeout:
    pass
print(data.decode(errors="replace"))
"#
    );
    let out = run(&fx, &["python3", "-c", &script]);
    assert!(out.stdout.contains("200 Connection Established"), "{out:?}");
    assert!(out.stdout.contains("hello from the host"), "{out:?}");
}

/// Regression: a plain `http://` request went on with the client's own `Host` header, so an
/// allowed shared front (a CDN, an ingress) could be asked for a site the allowlist does not
/// list.
#[test]
fn a_plain_http_request_reaches_only_the_host_of_its_url() {
    let port = host_echo_server();
    let fx = allowlist(&[&format!("127.0.0.1:{port}")], &[]);
    let out = curl(
        &fx,
        &[
            "-x",
            "http://127.0.0.1:3128",
            "-H",
            "Host: metadata.internal",
        ],
        &format!("http://127.0.0.1:{port}/"),
    );
    assert_eq!(out.stdout, format!("127.0.0.1:{port}"), "{out:?}");
}

#[test]
fn a_listed_name_that_resolves_to_a_private_address_is_refused() {
    let port = http_server();
    let fx = allowlist(&["localhost"], &[]);
    let out = curl(
        &fx,
        &["-x", "http://127.0.0.1:3128"],
        &format!("http://localhost:{port}/"),
    );
    assert!(!out.stdout.contains("hello"), "{out:?}");
    let refused = out.network.iter().find(|e| !e.allowed).expect("a refusal");
    let reason = refused.reason.as_deref().unwrap_or("");
    assert!(reason.contains("loopback"), "{reason}");
    // Deny wins, even over an address listed outright.
    let fx = allowlist(&["127.0.0.1"], &["127.0.0.0/8"]);
    let out = curl(
        &fx,
        &["-x", "http://127.0.0.1:3128"],
        &format!("http://127.0.0.1:{port}/"),
    );
    assert!(!out.stdout.contains("hello"), "{out:?}");
}

/// Regression: a range an operator lists for the LAN, or `0.0.0.0/0` for the internet, held
/// this machine's own address too, where its services listen on every address (the server's
/// own ports; on a laptop, its owner's): a command reached a server of the host's through it.
#[test]
fn this_machines_own_address_is_reached_only_through_an_entry_naming_it() {
    let own = monad_sandbox::exec::netpolicy::own_addresses().unwrap();
    let Some(address) = own.iter().find_map(|ip| match ip {
        std::net::IpAddr::V4(v4) if !v4.is_loopback() => Some(*v4),
        _ => None,
    }) else {
        panic!("this machine has no IPv4 address but its loopback's: {own:?}");
    };
    let port = serve_http_on("0.0.0.0:0", |_, _| "hello from the host".to_owned());
    let url = format!("http://{address}:{port}/");
    // The operator's range for where the address is: the internet, or its /24 of the LAN.
    let range = if monad_sandbox::exec::netpolicy::not_public(address.into()).is_none() {
        "0.0.0.0/0".to_owned()
    } else {
        let [a, b, c, _] = address.octets();
        format!("{a}.{b}.{c}.0/24")
    };
    let fx = allowlist(&[&range], &[]);
    let out = curl(&fx, &["-x", "http://127.0.0.1:3128"], &url);
    assert!(!out.stdout.contains("hello"), "{range}: {out:?}");
    let refused = out.network.iter().find(|e| !e.allowed).expect("a refusal");
    let reason = refused.reason.as_deref().unwrap_or("");
    assert!(reason.contains("this machine's own"), "{reason}");

    let fx = allowlist(&[&address.to_string()], &[]);
    let out = curl(&fx, &["-x", "http://127.0.0.1:3128"], &url);
    assert_eq!(out.stdout, "hello from the host", "{out:?}");
}

#[test]
fn the_allowlist_fails_closed_without_a_network_namespace() {
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            network: NetworkMode::Allowlist,
            allow: vec!["pypi.org".into()],
            namespaces: NamespacePolicy::Off,
            ..Default::default()
        },
    );
    let err = try_run(&fx, &super::support::args(&["true"])).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
    assert!(err.to_string().contains("allowlist"), "{err}");
}

#[test]
fn a_bad_allowlist_entry_is_a_clear_error() {
    let fx = allowlist(&["exa mple.com"], &[]);
    let err = try_run(&fx, &super::support::args(&["true"])).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert!(err.to_string().contains("exa mple.com"), "{err}");
}

#[test]
fn with_the_hosts_network_the_loopback_is_reachable() {
    let port = http_server();
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            network: NetworkMode::Host,
            ..Default::default()
        },
    );
    let out = curl(&fx, &[], &format!("http://127.0.0.1:{port}/"));
    assert_eq!(out.stdout, "hello from the host", "{out:?}");
}

/// A workspace's commands share one loopback: a server a background command starts is there
/// for the next command, and not for another workspace's.
#[test]
fn a_background_server_is_reachable_from_the_workspaces_next_commands_only() {
    use monad_protocol::ToolName;
    use serde_json::json;
    let rt = super::support::runtime();
    let fx = Fixture::new();
    let other = Fixture::new();
    rt.block_on(async {
        let started = fx
            .sandbox
            .call(
                ToolName::RunCommand,
                json!({"argv": ["python3", "-m", "http.server", "--bind", "127.0.0.1", "8001"],
                       "background": true}),
            )
            .await
            .unwrap();
        let id = started["process"].as_str().unwrap().to_owned();
        let probe = "for i in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:8001/ && break; \
                     sleep 0.05; done; curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8001/";
        let out = fx
            .sandbox
            .call(ToolName::RunCommand, json!({"argv": ["sh", "-c", probe]}))
            .await
            .unwrap();
        assert_eq!(out["stdout"], "200", "{out}");
        let out = other
            .sandbox
            .call(
                ToolName::RunCommand,
                json!({"argv": ["curl", "-sS", "--max-time", "5", "http://127.0.0.1:8001/"]}),
            )
            .await
            .unwrap();
        assert_ne!(out["exit_code"], 0, "another workspace reached it: {out}");
        fx.sandbox
            .call(ToolName::ProcessKill, json!({"process": id, "signal": "KILL"}))
            .await
            .unwrap();
    });
}

/// A plain request's body reaches the origin whole, however it arrives: the proxy passes on its
/// `Content-Length` bytes, and nothing after them.
#[test]
fn a_plain_http_requests_body_reaches_the_origin_whole() {
    let port = body_length_server();
    let fx = allowlist(&[&format!("127.0.0.1:{port}")], &[]);
    std::fs::write(fx.tmp.path().join("root/body.txt"), "x".repeat(300_000)).unwrap();
    let out = curl(
        &fx,
        &["-x", "http://127.0.0.1:3128", "--data-binary", "@body.txt"],
        &format!("http://127.0.0.1:{port}/"),
    );
    assert_eq!(out.stdout, "true 300000", "{out:?}");
}

/// Regression: a request the proxy could not read a destination from (an `https://` URL sent
/// as a plain request, a `CONNECT` without a port) was answered and recorded nowhere; it is in
/// the result like any refused connection.
#[test]
fn a_request_the_proxy_cannot_read_is_recorded() {
    let fx = allowlist(&["192.0.2.1:80"], &[]);
    let out = run(
        &fx,
        &[
            "bash",
            "-c",
            "exec 3<>/dev/tcp/127.0.0.1/3128; \
             printf 'GET https://c2.example/secret HTTP/1.1\\r\\nHost: c2.example\\r\\n\\r\\n' >&3; \
             head -c 12 <&3",
        ],
    );
    assert!(out.stdout.starts_with("HTTP/1.1 403"), "{out:?}");
    let recorded = out
        .network
        .iter()
        .find(|e| !e.allowed)
        .unwrap_or_else(|| panic!("recorded: {out:?}"));
    assert_eq!(recorded.port, 0, "{recorded:?}");
    assert!(
        recorded
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("CONNECT")),
        "{recorded:?}"
    );
}
