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
//! refused unless an `allow` entry names it as an address or a range holding only addresses of
//! its kind: a name is never enough, nor a wider range (`0.0.0.0/0` reaches public addresses,
//! not this machine's loopback, the LAN or the link-local metadata address). This machine's own
//! addresses (its interfaces', other than the loopback's: [`own_addresses`], read at each
//! connection) are refused unless an `allow` entry names the address itself: its services
//! listen there, often on every address, and neither a range of the LAN nor `0.0.0.0/0` says
//! the host is meant.
//!
//! Addresses and ranges are compared in IPv6's space, an IPv4 address or range standing for its
//! IPv4-mapped form (`10.0.0.0/8` is `[::ffff:10.0.0.0/104]`, and `[::ffff:10.0.0.1]` is
//! `10.0.0.1`). IPv6 addresses that reach an IPv4 address, IPv4-mapped (`::ffff:a.b.c.d`),
//! IPv4-translated (`::ffff:0:a.b.c.d`) and NAT64's well-known prefix (`64:ff9b::a.b.c.d`, what
//! DNS64 answers on an IPv6-only host), are judged by the IPv4 address they embed: public when
//! it is, and matched by the entries that name it. NAT64's local-use prefix (`64:ff9b:1::/48`),
//! where the IPv4 address sits wherever the network put it, and the deprecated IPv4-compatible
//! form (`::a.b.c.d`) are not public; 6to4 (`2002::/16`) is as public as its router's address.

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
    /// An address range in IPv6's space (an IPv4 range as its IPv4-mapped range), with its
    /// prefix length, 0 to 128 (a single address has 128).
    Range(u128, u8),
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

    /// [`NetPolicy::check_name`] for a tunnel (`CONNECT`, SOCKS), which carries whatever the
    /// command sends: to port 80, a plain HTTP request whose `Host` the proxy does not see, so
    /// an allowed shared front (a CDN, an ingress) could be asked for a site the allowlist does
    /// not list. A tunnel to port 80 needs an `allow` entry that names the port; through an
    /// entry without one, the command sends the `http://` URL to the proxy, which keeps the
    /// URL's host.
    pub fn check_tunnel(&self, host: &Host, port: u16) -> Result<(), String> {
        self.check_name(host, port)?;
        if port != 80
            || self
                .allow
                .iter()
                .any(|e| e.port == Some(80) && e.matches_host(host, port))
        {
            return Ok(());
        }
        Err(format!(
            "a tunnel to {host}:80 would carry a plain HTTP request for any site; send the \
             `http://` URL to the proxy instead, or allow `{host}:80` by name"
        ))
    }

    /// The second check, on the addresses `host` resolved to (or the address it is): those
    /// that may be connected to, in order, or the reason none may. `own` is this machine's
    /// own addresses ([`own_addresses`]).
    pub fn check_addresses(
        &self,
        host: &Host,
        port: u16,
        addresses: &[IpAddr],
        own: &[IpAddr],
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
            let kind = not_public(ip);
            // Linux connects to the unspecified address as to this machine's own loopback:
            // never a destination an entry could mean.
            if kind == Some("unspecified") {
                refused.get_or_insert(format!(
                    "{host} resolves to {ip}, the unspecified address, which reaches this \
                     machine itself; no entry lets a command reach it"
                ));
                continue;
            }
            if kind != Some("loopback")
                && is_own(ip, own)
                && !self
                    .allow
                    .iter()
                    .any(|e| e.matches_ip(ip, port) && e.is_one_address())
            {
                refused.get_or_insert(format!(
                    "{host} resolves to {ip}, an address of this machine's own; only an \
                     `allow` entry naming the address lets a command reach it (a range, such \
                     as the LAN's or `0.0.0.0/0`, does not)"
                ));
                continue;
            }
            if let Some(kind) = kind
                && !self
                    .allow
                    .iter()
                    .any(|e| e.matches_ip(ip, port) && e.only_of_kind(kind))
            {
                refused.get_or_insert(format!(
                    "{host} resolves to {ip}, a {kind} address; only an `allow` entry naming \
                     the address or a range of {kind} addresses lets a command reach it (a \
                     wider range, such as `0.0.0.0/0`, does not)"
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
            range(ip, bits)
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            range(ip, if ip.is_ipv4() { 32 } else { 128 })
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

    /// Whether the entry's range holds addresses of `kind` only (its first and last are), as
    /// a range that lets a command reach such an address must: `0.0.0.0/0`, written to reach
    /// "the internet" by address, would otherwise open this machine's loopback services, the
    /// LAN and the link-local metadata address too.
    fn only_of_kind(&self, kind: &str) -> bool {
        let Target::Range(net, bits) = self.target else {
            return false;
        };
        let last = match 128u32.checked_sub(u32::from(bits)) {
            Some(0) | None => net,
            Some(128) => u128::MAX,
            Some(free) => net | ((1u128 << free) - 1),
        };
        let address = |bits: u128| {
            let v6 = Ipv6Addr::from(bits);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        };
        not_public(address(net)) == Some(kind) && not_public(address(last)) == Some(kind)
    }

    /// Whether the entry names one address (`203.0.113.7`, `[2001:db8::1]`, or a range of
    /// one: `/32`, `/128`).
    fn is_one_address(&self) -> bool {
        matches!(self.target, Target::Range(_, 128))
    }

    /// Whether `ip` (or the IPv4 address it reaches, see the module documentation) is in the
    /// entry's range, on a port it covers.
    fn matches_ip(&self, ip: IpAddr, port: u16) -> bool {
        let Target::Range(net, bits) = self.target else {
            return false;
        };
        let (itself, reached) = identities(ip);
        self.port_matches(port)
            && (within(itself, net, bits) || reached.is_some_and(|r| within(r, net, bits)))
    }
}

/// A range of `ip` with `bits` (at most 32 for IPv4, 128 for IPv6) in IPv6's space.
fn range(ip: IpAddr, bits: u8) -> Target {
    match ip {
        IpAddr::V4(v4) => Target::Range(mapped(v4), bits.saturating_add(96)),
        IpAddr::V6(v6) => Target::Range(u128::from(v6), bits),
    }
}

/// IPv4 address `v4` as its IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
fn mapped(v4: Ipv4Addr) -> u128 {
    u128::from(v4.to_ipv6_mapped())
}

/// `ip` in IPv6's space, and the IPv4 address (as mapped) it reaches when it embeds one.
fn identities(ip: IpAddr) -> (u128, Option<u128>) {
    match ip {
        IpAddr::V4(v4) => (mapped(v4), None),
        IpAddr::V6(v6) => (u128::from(v6), embedded_v4(v6).map(mapped)),
    }
}

/// The IPv4 address an IPv6 address reaches: IPv4-mapped (`::ffff:0:0/96`), IPv4-translated
/// (`::ffff:0:0:0/96`) and NAT64's well-known prefix (`64:ff9b::/96`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let prefix = bits >> 32;
    [0xffff, 0xffff_0000, 0x64_ff9b << 64]
        .contains(&prefix)
        .then(|| Ipv4Addr::from(bits as u32))
}

/// The addresses of this machine's network interfaces, up or down: the host a command's
/// connections leave from, whose services listen on them (often on every address at once).
pub fn own_addresses() -> Result<Vec<IpAddr>, String> {
    let interfaces = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("cannot list this machine's own addresses: {e}"))?;
    Ok(interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            address
                .as_sockaddr_in()
                .map(|a| IpAddr::V4(a.ip()))
                .or_else(|| address.as_sockaddr_in6().map(|a| IpAddr::V6(a.ip())))
        })
        .collect())
}

/// Whether `ip` is one of `own`, also as the IPv4 address an IPv6 form of it reaches.
fn is_own(ip: IpAddr, own: &[IpAddr]) -> bool {
    let (itself, reached) = identities(ip);
    own.iter().any(|&o| {
        let (theirs, _) = identities(o);
        theirs == itself || reached == Some(theirs)
    })
}

/// Whether the first `bits` bits (0 to 128; more match nothing) of `ip` and `net` agree.
fn within(ip: u128, net: u128, bits: u8) -> bool {
    let Some(shift) = 128u32.checked_sub(u32::from(bits)) else {
        return false;
    };
    let mask = u128::MAX.checked_shl(shift).unwrap_or(0);
    ip & mask == net & mask
}

/// What kind of non-public address `ip` is, or `None` for a public one. An IPv6 address that
/// reaches an embedded IPv4 address is judged by that one.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => not_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => not_public_v4(v4),
            None => not_public_v6(v6),
        },
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
        .find(|(_, net, bits)| within(mapped(ip), mapped(Ipv4Addr::from(*net)), 96 + bits))
        .map(|(kind, _, _)| *kind)
}

fn not_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let v6 = |s: &str| s.parse::<Ipv6Addr>().expect("a literal");
    let bits = u128::from(ip);
    let within = |net: &str, prefix| within(bits, u128::from(v6(net)), prefix);
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // The deprecated IPv4-compatible form: not routed.
    if within("::", 96) {
        return not_public_v4(Ipv4Addr::from(bits as u32)).or(Some("IPv4-compatible"));
    }
    // NAT64's local-use prefix: the embedded IPv4 address may sit anywhere after it.
    if within("64:ff9b:1::", 48) {
        return Some("NAT64 local-use");
    }
    // 6to4: a router at the embedded IPv4 address.
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

    /// Regression: a wide range (`0.0.0.0/0`, to reach "the internet" by address) let commands
    /// reach this machine's loopback services, the LAN and the link-local metadata address.
    #[test]
    fn a_special_address_is_reached_only_through_a_range_of_its_own_kind() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let wide = policy(&["0.0.0.0/0", "::/0", "0.0.0.0/1"], &[]);
        for special in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "fd00::1"] {
            let e = wide
                .check_addresses(&host("x.example"), 80, &[ip(special)], &[])
                .unwrap_err();
            assert!(e.contains("a wider range"), "{special}: {e}");
        }
        assert!(
            wide.check_addresses(&host("x.example"), 80, &[ip("93.184.216.34")], &[])
                .is_ok()
        );
        let own = policy(
            &[
                "127.0.0.1",
                "10.0.0.0/8",
                "169.254.0.0/16",
                "fd00::/8",
                "192.168.0.0/15",
            ],
            &[],
        );
        for reached in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "fd00::1"] {
            assert!(
                own.check_addresses(&host("x.example"), 80, &[ip(reached)], &[])
                    .is_ok(),
                "{reached}"
            );
        }
        // A range reaching past its block is not of one kind.
        assert!(
            own.check_addresses(&host("x.example"), 80, &[ip("192.168.1.1")], &[])
                .is_err()
        );
        assert!(
            own.check_addresses(&host("x.example"), 80, &[ip("127.0.0.2")], &[])
                .is_err()
        );
    }

    /// Regression: a range listed for the LAN or for the internet (`10.0.0.0/8`, `0.0.0.0/0`)
    /// let commands reach this machine's own addresses, where its services listen (often on
    /// every address at once): the server's own ports, or on a laptop its owner's.
    #[test]
    fn this_machines_own_address_is_reached_only_through_an_entry_naming_it() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let own = [
            ip("127.0.0.1"),
            ip("10.1.2.3"),
            ip("93.184.216.34"),
            ip("2001:db8:1::5"),
        ];
        let wide = policy(&["0.0.0.0/0", "::/0", "10.0.0.0/8", "[2001:db8::/32]"], &[]);
        for address in [
            "10.1.2.3",
            "93.184.216.34",
            "::ffff:93.184.216.34",
            "2001:db8:1::5",
        ] {
            let e = wide
                .check_addresses(&host("x.example"), 80, &[ip(address)], &own)
                .unwrap_err();
            assert!(e.contains("this machine's own"), "{address}: {e}");
        }
        // Others of the range, and this machine's loopback named outright, as before.
        assert!(
            wide.check_addresses(
                &host("x.example"),
                80,
                &[ip("10.1.2.4"), ip("1.1.1.1")],
                &own
            )
            .is_ok_and(|ok| ok.len() == 2)
        );
        let loopback = policy(&["127.0.0.1", "127.0.0.0/8"], &[]);
        assert!(
            loopback
                .check_addresses(&host("127.0.0.1"), 80, &[ip("127.0.0.1")], &own)
                .is_ok()
        );
        // Named outright, with or without its port, and as the address it is in IPv6's space.
        let named = policy(
            &["93.184.216.34:443", "10.1.2.3/32", "[2001:db8:1::5]"],
            &[],
        );
        for (address, port) in [
            ("93.184.216.34", 443),
            ("::ffff:93.184.216.34", 443),
            ("10.1.2.3", 80),
            ("2001:db8:1::5", 80),
        ] {
            assert!(
                named
                    .check_addresses(&host("x.example"), port, &[ip(address)], &own)
                    .is_ok(),
                "{address}:{port}"
            );
        }
        assert!(
            named
                .check_addresses(&host("x.example"), 80, &[ip("93.184.216.34")], &own)
                .is_err()
        );
    }

    /// What [`own_addresses`] reads is what the kernel has: the loopback's, and each of the
    /// others `ip` shows.
    #[test]
    fn own_addresses_are_the_interfaces() {
        let own = own_addresses().unwrap();
        assert!(own.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{own:?}");
        let out = std::process::Command::new("ip")
            .args(["-o", "addr"])
            .output();
        let Some(out) = out.as_ref().ok().filter(|out| out.status.success()) else {
            panic!("`ip -o addr` (iproute2) is needed to check this machine's addresses: {out:?}");
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut words = line.split_whitespace();
            let Some(address) = words
                .find(|w| *w == "inet" || *w == "inet6")
                .and(words.next())
            else {
                continue;
            };
            let address: IpAddr = address.split('/').next().unwrap().parse().unwrap();
            assert!(own.contains(&address), "{address} missing from {own:?}");
        }
    }

    /// Regression: an entry naming the unspecified address (`0.0.0.0`, `[::]`) let commands
    /// connect to it, which Linux takes as this machine's own loopback.
    #[test]
    fn the_unspecified_address_is_never_reached() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = policy(&["0.0.0.0", "0.0.0.0/8", "[::]", "[::ffff:0.0.0.0]"], &[]);
        for address in ["0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0"] {
            let e = p
                .check_addresses(&host(address), 80, &[ip(address)], &[])
                .unwrap_err();
            assert!(e.contains("unspecified"), "{address}: {e}");
        }
    }

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
        // A tunnel to port 80 needs an entry that names the port; plain HTTP does not.
        assert!(p.check_tunnel(&host("pypi.org"), 443).is_ok());
        let refused = p.check_tunnel(&host("pypi.org"), 80).unwrap_err();
        assert!(refused.contains("send the `http://` URL"), "{refused}");
        assert!(p.check_tunnel(&host("evil.pypi.org"), 443).is_err());
        let named = NetPolicy::parse(&["cdn.example:80".into()], &[]).unwrap();
        assert!(named.check_tunnel(&host("cdn.example"), 80).is_ok());
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
            let why = p.check_addresses(&name, 443, &[ip], &[]).unwrap_err();
            assert!(
                why.contains(private) || why.contains("resolves"),
                "{private}: {why}"
            );
        }
        // Mixed answers: only the public address is used.
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let private: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(
            p.check_addresses(&name, 443, &[private, public], &[])
                .unwrap(),
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
        assert!(p.check_addresses(&db, 5432, &[ip("10.1.2.3")], &[]).is_ok());
        assert!(
            p.check_addresses(&db, 5433, &[ip("10.1.2.3")], &[])
                .is_err(),
            "port-bound"
        );
        assert!(p.check_addresses(&db, 80, &[ip("10.2.0.1")], &[]).is_err());
        assert!(p.check_name(&host("127.0.0.1"), 8080).is_ok());
        assert!(
            p.check_addresses(&host("127.0.0.1"), 8080, &[ip("127.0.0.1")], &[])
                .is_ok()
        );
        assert!(p.check_addresses(&db, 1, &[ip("fd12::1")], &[]).is_ok());
        assert!(
            p.check_addresses(&db, 1, &[ip("::ffff:127.0.0.1")], &[])
                .is_ok(),
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

    /// Regression: an IPv4-mapped IPv6 entry kept its IPv6 prefix length while the addresses
    /// were compared as IPv4 (`32 - 128` overflowed): as an `allow` entry it let every IPv4
    /// address through (release) or panicked (debug); as a `deny` entry it denied all IPv4.
    #[test]
    fn an_ipv4_mapped_entry_means_that_ipv4_address_only() {
        let name = host("x.example.org");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for allow in [
            "::ffff:10.0.0.1",
            "[::ffff:10.0.0.1]",
            "[::ffff:10.0.0.0/120]:80",
        ] {
            let p = policy(&[allow], &[]);
            assert!(
                p.check_addresses(&name, 80, &[ip("10.0.0.1")], &[]).is_ok(),
                "{allow}"
            );
            assert!(
                p.check_addresses(&name, 80, &[ip("::ffff:10.0.0.1")], &[])
                    .is_ok(),
                "{allow}"
            );
            for other in ["169.254.169.254", "10.0.1.1", "127.0.0.1", "192.168.0.1"] {
                assert!(
                    p.check_addresses(&name, 80, &[ip(other)], &[]).is_err(),
                    "{allow} let {other} through"
                );
            }
        }
        let p = policy(&["*.example.org"], &["::ffff:93.184.216.34"]);
        assert!(
            p.check_addresses(&name, 443, &[ip("93.184.216.34")], &[])
                .is_err()
        );
        assert!(
            p.check_addresses(&name, 443, &[ip("1.1.1.1")], &[]).is_ok(),
            "a mapped deny entry denies its own address, not all of IPv4"
        );
        // The mapped range as a whole is IPv4 as a whole, as written: public addresses, not
        // the special ones within it (a range of their own kind is needed for those).
        let p = policy(&["[::ffff:0:0/96]"], &[]);
        assert!(
            p.check_addresses(&name, 80, &[ip("93.184.216.34")], &[])
                .is_ok(),
            "listed by range"
        );
        assert!(
            p.check_addresses(&name, 80, &[ip("10.9.8.7")], &[])
                .is_err()
        );
        assert!(p.check_addresses(&name, 80, &[ip("fd00::1")], &[]).is_err());
    }

    #[test]
    fn ipv6_forms_that_embed_an_ipv4_address_are_judged_by_it() {
        let p = policy(&["packages.example.org"], &[]);
        let name = host("packages.example.org");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // NAT64's well-known prefix (DNS64 answers on IPv6-only hosts), IPv4-mapped and
        // IPv4-translated addresses reach the IPv4 address they embed.
        for public in [
            "64:ff9b::5db8:d822",
            "::ffff:93.184.216.34",
            "::ffff:0:5db8:d822",
        ] {
            assert!(
                p.check_addresses(&name, 443, &[ip(public)], &[]).is_ok(),
                "{public} embeds a public address"
            );
        }
        for private in [
            "64:ff9b::a00:5",
            "64:ff9b::a9fe:a9fe",
            "::ffff:0:a00:5",
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            // NAT64's local-use prefix: where the IPv4 address sits depends on the network.
            "64:ff9b:1::a00:5",
            "64:ff9b:1:abcd::5db8:d822",
        ] {
            assert!(
                p.check_addresses(&name, 443, &[ip(private)], &[]).is_err(),
                "{private} let through"
            );
        }
        // A deny entry for an IPv4 address covers the forms that embed it.
        let p = policy(&["*.example.org"], &["93.184.216.34"]);
        for form in [
            "93.184.216.34",
            "::ffff:93.184.216.34",
            "64:ff9b::5db8:d822",
            "::ffff:0:5db8:d822",
        ] {
            let why = p.check_addresses(&name, 443, &[ip(form)], &[]).unwrap_err();
            assert!(why.contains("denied"), "{form}: {why}");
        }
        // And an allow entry naming a private IPv4 address, too.
        let p = policy(&["10.0.0.5"], &[]);
        assert!(
            p.check_addresses(&name, 80, &[ip("64:ff9b::a00:5")], &[])
                .is_ok()
        );
        assert!(
            p.check_addresses(&name, 80, &[ip("64:ff9b::a00:6")], &[])
                .is_err()
        );
    }

    /// Addresses as tests pick them: any IPv4 or IPv6 address, and often an IPv6 form that
    /// embeds an IPv4 address.
    fn any_address() -> impl proptest::strategy::Strategy<Value = IpAddr> {
        use proptest::prelude::*;
        let v4 = any::<[u8; 4]>().prop_map(Ipv4Addr::from);
        prop_oneof![
            v4.clone().prop_map(IpAddr::V4),
            any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            v4.clone().prop_map(|a| IpAddr::V6(a.to_ipv6_mapped())),
            v4.clone().prop_map(|a| IpAddr::V6(Ipv6Addr::from(
                0x64_ff9b_u128 << 96 | u128::from(u32::from(a))
            ))),
            v4.prop_map(|a| IpAddr::V6(Ipv6Addr::from(
                0xffff_0000_0000_u128 << 32 | u128::from(u32::from(a))
            ))),
            any::<u128>()
                .prop_map(|r| IpAddr::V6(Ipv6Addr::from(0x64_ff9b_0001_u128 << 80 | r >> 48))),
        ]
    }

    /// The address in IPv6's space (IPv4 as IPv4-mapped), and, for the forms that reach an
    /// embedded IPv4 address, that one too: a reference written bit by bit.
    fn reference_identities(ip: IpAddr) -> Vec<u128> {
        let mapped = |v4: u32| 0xffff_u128 << 32 | u128::from(v4);
        match ip {
            IpAddr::V4(v4) => vec![mapped(u32::from(v4))],
            IpAddr::V6(v6) => {
                let n = u128::from(v6);
                let mut out = vec![n];
                if n >> 32 == 0x64_ff9b_u128 << 64 || n >> 32 == 0xffff_0000_u128 {
                    out.push(mapped(n as u32));
                }
                out
            }
        }
    }

    fn reference_within(ip: u128, net: u128, bits: u32) -> bool {
        (0..bits).all(|i| (ip >> (127 - i)) & 1 == (net >> (127 - i)) & 1)
    }

    proptest::proptest! {
        /// Any entry matches any address without a panic, exactly as a bit-by-bit reference
        /// says: IPv4 entries and addresses live in IPv6's space as IPv4-mapped ones.
        #[test]
        fn entries_match_as_a_bitwise_reference_says(
            net in any_address(),
            bits in 0u32..=128,
            ip in any_address(),
            port in proptest::option::of(1u16..),
            asked in 1u16..,
            bracketed in proptest::bool::ANY,
        ) {
            let bits = if net.is_ipv4() { bits % 33 } else { bits };
            let range = match (net, bracketed) {
                (IpAddr::V6(v6), true) => format!("[{v6}/{bits}]"),
                (net, _) => format!("{net}/{bits}"),
            };
            let text = match port {
                Some(port) if net.is_ipv6() && !bracketed => format!("[{range}]:{port}"),
                Some(port) => format!("{range}:{port}"),
                None => range,
            };
            let entry = Entry::parse(&text).unwrap();
            let net_bits = if net.is_ipv4() { bits + 96 } else { bits };
            let [net128] = reference_identities(net)[..1] else { unreachable!() };
            let want = port.is_none_or(|p| p == asked)
                && reference_identities(ip).into_iter().any(|i| reference_within(i, net128, net_bits));
            proptest::prop_assert_eq!(entry.matches_ip(ip, asked), want, "{} {}", text, ip);
            let single = Entry::parse(&format!("{ip}")).unwrap();
            proptest::prop_assert!(single.matches_ip(ip, asked));
        }

        /// An IPv4 address is as public in each IPv6 form that reaches it as it is itself.
        #[test]
        fn embedded_forms_are_as_public_as_their_ipv4_address(v4 in proptest::prelude::any::<[u8; 4]>()) {
            let v4 = Ipv4Addr::from(v4);
            let n = u128::from(u32::from(v4));
            let want = not_public(IpAddr::V4(v4));
            for form in [0xffff_u128 << 32 | n, 0x64_ff9b_u128 << 96 | n, 0xffff_0000_u128 << 32 | n] {
                proptest::prop_assert_eq!(not_public(IpAddr::V6(Ipv6Addr::from(form))), want, "{}", v4);
            }
        }

        /// Whatever an operator writes, parsing answers (`Ok` or an error), never panics.
        #[test]
        fn any_entry_text_parses_or_is_an_error(text in ".{0,40}") {
            let _ = Entry::parse(&text);
            let _ = Host::parse(&text);
        }
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
