//! Which destinations `network = "allowlist"` lets a command reach: a pure decision over the
//! operator's `allow` and `deny` lists, made twice for each connection the proxy is asked for:
//! on the name the command gave ([`NetPolicy::check_name`]), then on the addresses the name
//! resolved to ([`NetPolicy::check_addresses`]), so that a listed name cannot lead to a private
//! address. The proxy connects to the addresses that passed, never resolving again.
//!
//! Entries (`allow` and `deny` alike):
//!
//! | entry | matches |
//! |---|---|
//! | `pypi.org` | that name |
//! | `*.example.com` | any name under `example.com` (not `example.com` itself) |
//! | `203.0.113.7`, `[2001:db8::1]` | that address, asked for directly or resolved to |
//! | `10.1.0.0/16`, `[fd00::/8]` | any address in the range |
//! | any of the above `:443` | only on that port |
//!
//! Deny wins over allow. An address that is not public (loopback, private, link-local, carrier
//! NAT, multicast, reserved, documentation, and IPv6 forms that embed such an IPv4 address) is
//! refused unless an `allow` entry names it as an address or a range: a name is never enough.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One entry of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    target: Target,
    port: Option<u16>,
    /// As written, for messages.
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A host name, lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: stored as `.suffix`.
    Under(String),
    /// An address range (a single address has the full prefix).
    Range(IpAddr, u8),
}

/// The parsed `allow` and `deny` lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetPolicy {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
}

/// A host as a command asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A name to resolve.
    Name(String),
    /// An address.
    Address(IpAddr),
}

impl Host {
    /// Parses a host from a request: a name (checked for DNS syntax, lowercased), or an IPv4 or
    /// IPv6 address (with or without brackets).
    pub fn parse(raw: &str) -> Result<Host, String> {
        let trimmed = raw.trim_end_matches('.');
        let bare = trimmed
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(trimmed);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Host::Address(ip));
        }
        let name = trimmed.to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if valid {
            Ok(Host::Name(name))
        } else {
            Err(format!("`{raw}` is not a host name or an address"))
        }
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Address(ip) => write!(f, "{ip}"),
        }
    }
}

impl NetPolicy {
    /// Parses the operator's lists; an entry that does not parse is an error naming it.
    pub fn parse(allow: &[String], deny: &[String]) -> Result<NetPolicy, String> {
        let parse_all = |list: &[String], key: &str| {
            list.iter()
                .map(|e| Entry::parse(e).map_err(|why| format!("[exec] {key}: {why}")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(NetPolicy {
            allow: parse_all(allow, "allow")?,
            deny: parse_all(deny, "deny")?,
        })
    }

    /// The first check, on what the command asked for: `Err` with the reason when refused.
    pub fn check_name(&self, host: &Host, port: u16) -> Result<(), String> {
        if let Some(entry) = self.deny.iter().find(|e| e.matches_host(host, port)) {
            return Err(format!("{host}:{port} is denied (`{}`)", entry.text));
        }
        if self.allow.iter().any(|e| e.matches_host(host, port)) {
            return Ok(());
        }
        Err(format!("{host}:{port} is not in the allowlist"))
    }

    /// The second check, on the addresses `host` resolved to (or the address it is): those
    /// that may be connected to, in order, or the reason none may.
    pub fn check_addresses(
        &self,
        host: &Host,
        port: u16,
        addresses: &[IpAddr],
    ) -> Result<Vec<SocketAddr>, String> {
        let mut refused = None;
        let mut ok = Vec::new();
        for &ip in addresses {
            if let Some(entry) = self.deny.iter().find(|e| e.matches_ip(ip, port)) {
                refused.get_or_insert(format!(
                    "{host} resolves to {ip}, which is denied (`{}`)",
                    entry.text
                ));
                continue;
            }
            if let Some(kind) = not_public(ip)
                && !self.allow.iter().any(|e| e.matches_ip(ip, port))
            {
                refused.get_or_insert(format!(
                    "{host} resolves to {ip}, a {kind} address; only an `allow` entry naming \
                     the address or its range lets a command reach it"
                ));
                continue;
            }
            ok.push(SocketAddr::new(ip, port));
        }
        if ok.is_empty() {
            Err(refused.unwrap_or_else(|| format!("{host} resolves to no address")))
        } else {
            Ok(ok)
        }
    }
}

impl Entry {
    fn parse(raw: &str) -> Result<Entry, String> {
        let text = raw.trim();
        let bad = |why: &str| format!("`{raw}` {why}");
        if text.is_empty() {
            return Err(bad("is empty"));
        }
        // `[v6]`, `[v6]:port`, `[v6/n]:port`, else `host[:port]` with at most one colon.
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("opens `[` without closing it"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("has text after `]`"))?,
                ),
            };
            (inside, port)
        } else if text.matches(':').count() > 1 {
            // A bare IPv6 address (or range), no port.
            (text, None)
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            }
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("has a port that is not 1 to 65535"))
            })
            .transpose()?;
        let target = if let Some((ip, bits)) = host.split_once('/') {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| bad("has a range whose address does not parse"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = bits
                .parse()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| bad("has a prefix length out of range"))?;
            Target::Range(ip, bits)
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            Target::Range(ip, if ip.is_ipv4() { 32 } else { 128 })
        } else if let Some(suffix) = host.strip_prefix("*.") {
            match Host::parse(suffix) {
                Ok(Host::Name(name)) => Target::Under(format!(".{name}")),
                _ => return Err(bad("is not `*.` followed by a domain")),
            }
        } else {
            match Host::parse(host) {
                Ok(Host::Name(name)) => Target::Name(name),
                _ => return Err(bad("is not a host name, an address or a range")),
            }
        };
        Ok(Entry {
            target,
            port,
            text: text.to_owned(),
        })
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    fn matches_host(&self, host: &Host, port: u16) -> bool {
        self.port_matches(port)
            && match (&self.target, host) {
                (Target::Name(want), Host::Name(name)) => want == name,
                (Target::Under(suffix), Host::Name(name)) => name.ends_with(suffix.as_str()),
                (Target::Range(..), Host::Address(ip)) => self.matches_ip(*ip, port),
                _ => false,
            }
    }

    fn matches_ip(&self, ip: IpAddr, port: u16) -> bool {
        let Target::Range(net, bits) = self.target else {
            return false;
        };
        self.port_matches(port) && in_range(canonical(ip), canonical(net), bits)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

fn in_range(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// What kind of non-public address `ip` is, or `None` for a public one.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => not_public_v4(v4),
        IpAddr::V6(v6) => not_public_v6(v6),
    }
}

fn not_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let ranges: &[(&str, [u8; 4], u8)] = &[
        ("unspecified", [0, 0, 0, 0], 8),
        ("loopback", [127, 0, 0, 0], 8),
        ("private", [10, 0, 0, 0], 8),
        ("private", [172, 16, 0, 0], 12),
        ("private", [192, 168, 0, 0], 16),
        ("link-local", [169, 254, 0, 0], 16),
        ("carrier-grade NAT", [100, 64, 0, 0], 10),
        ("IETF protocol", [192, 0, 0, 0], 24),
        ("documentation", [192, 0, 2, 0], 24),
        ("documentation", [198, 51, 100, 0], 24),
        ("documentation", [203, 0, 113, 0], 24),
        ("benchmarking", [198, 18, 0, 0], 15),
        ("multicast", [224, 0, 0, 0], 4),
        ("reserved", [240, 0, 0, 0], 4),
    ];
    ranges
        .iter()
        .find(|(_, net, bits)| in_range(IpAddr::V4(ip), IpAddr::V4(Ipv4Addr::from(*net)), *bits))
        .map(|(kind, _, _)| *kind)
}

fn not_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("a literal");
    let within = |net: &str, bits| in_range(IpAddr::V6(ip), IpAddr::V6(v6(net)), bits);
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // IPv4 inside IPv6: NAT64 (64:ff9b::/96), IPv4-compatible (::/96) and 6to4 (2002::/16)
    // reach the embedded IPv4 address; judge that one.
    if within("64:ff9b::", 96) || within("::", 96) {
        return not_public_v4(Ipv4Addr::from(bits as u32)).or(Some("IPv4-embedding"));
    }
    if within("2002::", 16) {
        let embedded = Ipv4Addr::from((bits >> 80) as u32);
        return not_public_v4(embedded);
    }
    [
        ("unique local", "fc00::", 7),
        ("link-local", "fe80::", 10),
        ("multicast", "ff00::", 8),
        ("documentation", "2001:db8::", 32),
        ("Teredo", "2001::", 32),
        ("site-local", "fec0::", 10),
    ]
    .into_iter()
    .find(|(_, net, bits)| within(net, *bits))
    .map(|(kind, _, _)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> NetPolicy {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        NetPolicy::parse(&owned(allow), &owned(deny)).unwrap()
    }

    fn host(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn names_suffixes_and_ports() {
        let p = policy(
            &["pypi.org", "*.pythonhosted.org", "git.example.com:22"],
            &[],
        );
        assert!(p.check_name(&host("pypi.org"), 443).is_ok());
        assert!(p.check_name(&host("PyPI.org."), 80).is_ok());
        assert!(p.check_name(&host("evil.pypi.org"), 443).is_err());
        assert!(p.check_name(&host("files.pythonhosted.org"), 443).is_ok());
        assert!(p.check_name(&host("a.b.pythonhosted.org"), 443).is_ok());
        assert!(
            p.check_name(&host("pythonhosted.org"), 443).is_err(),
            "`*.` means under, not the domain itself"
        );
        assert!(p.check_name(&host("evilpythonhosted.org"), 443).is_err());
        assert!(p.check_name(&host("git.example.com"), 22).is_ok());
        assert!(p.check_name(&host("git.example.com"), 443).is_err());
        assert!(p.check_name(&host("10.0.0.1"), 443).is_err());
    }

    #[test]
    fn deny_wins() {
        let p = policy(
            &["*.example.com"],
            &["secret.example.com", "*.internal.example.com"],
        );
        assert!(p.check_name(&host("www.example.com"), 443).is_ok());
        let why = p.check_name(&host("secret.example.com"), 443).unwrap_err();
        assert!(why.contains("denied"), "{why}");
        assert!(p.check_name(&host("a.internal.example.com"), 80).is_err());
        let p = policy(&["203.0.113.0/24"], &["203.0.113.9"]);
        assert!(p.check_name(&host("203.0.113.8"), 80).is_ok());
        assert!(p.check_name(&host("203.0.113.9"), 80).is_err());
    }

    #[test]
    fn a_listed_name_that_resolves_to_a_private_address_is_refused() {
        let p = policy(&["packages.example.org"], &[]);
        let name = host("packages.example.org");
        for private in [
            "10.0.0.5",
            "127.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "::1",
            "fd00::1",
            "::ffff:10.0.0.5",
            "64:ff9b::a00:5",
            "2002:a00:5::1",
            "100.64.0.1",
            "0.0.0.0",
        ] {
            let ip: IpAddr = private.parse().unwrap();
            let why = p.check_addresses(&name, 443, &[ip]).unwrap_err();
            assert!(
                why.contains(private) || why.contains("resolves"),
                "{private}: {why}"
            );
        }
        // Mixed answers: only the public address is used.
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let private: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(
            p.check_addresses(&name, 443, &[private, public]).unwrap(),
            [SocketAddr::new(public, 443)]
        );
    }

    #[test]
    fn private_addresses_pass_only_when_listed_as_addresses() {
        let p = policy(
            &["10.1.0.0/16:5432", "127.0.0.1", "[fd00::/8]", "db.internal"],
            &[],
        );
        let db = host("db.internal");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p.check_addresses(&db, 5432, &[ip("10.1.2.3")]).is_ok());
        assert!(
            p.check_addresses(&db, 5433, &[ip("10.1.2.3")]).is_err(),
            "port-bound"
        );
        assert!(p.check_addresses(&db, 80, &[ip("10.2.0.1")]).is_err());
        assert!(p.check_name(&host("127.0.0.1"), 8080).is_ok());
        assert!(
            p.check_addresses(&host("127.0.0.1"), 8080, &[ip("127.0.0.1")])
                .is_ok()
        );
        assert!(p.check_addresses(&db, 1, &[ip("fd12::1")]).is_ok());
        assert!(
            p.check_addresses(&db, 1, &[ip("::ffff:127.0.0.1")]).is_ok(),
            "mapped is the v4 address"
        );
    }

    #[test]
    fn bad_entries_and_hosts_are_clear_errors() {
        for bad in [
            "",
            "a b",
            "*.",
            "*",
            "host:0",
            "host:99999",
            "10.0.0.0/33",
            "[::1",
            "[::1]x",
            "ex*ample.com",
        ] {
            let err = NetPolicy::parse(&[bad.to_string()], &[]).unwrap_err();
            assert!(err.contains("[exec] allow"), "{bad}: {err}");
        }
        assert!(Host::parse("a..b").is_err());
        assert!(Host::parse(&"a".repeat(300)).is_err());
        assert!(Host::parse("exa mple").is_err());
        assert_eq!(
            Host::parse("[::1]").unwrap(),
            Host::Address("::1".parse().unwrap())
        );
    }

    #[test]
    fn public_addresses_are_public() {
        for ip in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700::1111",
            "172.32.0.1",
            "192.169.0.1",
        ] {
            assert_eq!(not_public(ip.parse().unwrap()), None, "{ip}");
        }
    }
}
